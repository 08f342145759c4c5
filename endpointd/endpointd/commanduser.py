"""Who a confined command runs as when the daemon runs as root (Linux): an unprivileged
user, through id-mapped mounts, never uid 0.

Without capabilities (:mod:`endpointd.guard.capabilities`) a root daemon's command still
kept uid 0, and uid 0 *owns* most of the machine: every root-owned ``0600`` file in its
view was readable to it, every root-owned file in a granted directory writable, and much
of the kernel's interface (``/sys``, sockets) answers uid 0 differently. So a root
daemon's command runs as ``nobody`` (:data:`UID`, :data:`GID`), and the directories the
view grants it (its workspace, its TMPDIR, the owner's grants, its clone's git directory)
are bound *id-mapped*: through those mounts a file root owns on disk is seen as owned by
``nobody``, and what ``nobody`` creates lands on disk owned by root. So the command
works as before in what it was granted, owns nothing else, and the daemon finds its
files where and as they always were. The system directories are not id-mapped: there the
command is "others", as any user's process.

The id map is a user namespace whose ``uid_map`` and ``gid_map`` read ``0 <UID> 1``
(:func:`userns_fd`), made once per process by a short-lived child and held as a file
descriptor; the mounts are made with ``open_tree``, ``mount_setattr(MOUNT_ATTR_IDMAP)``
and ``move_mount`` (Linux 5.12, and a filesystem that supports id-mapped mounts: ext4,
xfs, btrfs, tmpfs from 6.3...). Where a granted directory cannot be id-mapped, the
command is not started: the init reports the step ``id-mapped mount`` with the errno.

A normal user's daemon runs its commands as that user, in a user namespace of its own
(:mod:`endpointd.guard.namespaces`): nothing here applies.

Standard library only (the supervisor and the init run in a bare interpreter).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import struct
import sys

from endpointd.libc import check as _check
from endpointd.libc import libc as _c

__all__ = ["GID", "UID", "applies", "become", "bind", "held", "is_command_uid", "userns_fd"]


def _nobody() -> tuple[int, int]:
    # nobody's passwd entry (ssh, whoami and git look the running user up): its ids
    # where the system names them, else the kernel's overflow ids.
    try:
        import pwd

        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    except (ImportError, KeyError):
        return 65534, 65534


UID, GID = _nobody()

CLONE_NEWUSER = 0x10000000
_SYS = {
    # open_tree, move_mount, mount_setattr: the same numbers on every architecture that
    # has them (the generic table), but x86_64's were assigned in its own table too.
    "open_tree": 428,
    "move_mount": 429,
    "mount_setattr": 442,
}
OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = 0o2000000
AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_IDMAP = 0x00100000

_userns: int | None = None


def applies() -> bool:
    """Whether commands here run as :data:`UID` in an id-mapped view: a root daemon on
    Linux."""
    return sys.platform.startswith("linux") and os.geteuid() == 0


def is_command_uid(uid: int) -> bool:
    """Whether a process of ``uid`` may be one of the daemon's commands: the daemon's
    own user, or :data:`UID` when :func:`applies` (callers check descent as well)."""
    return uid == os.geteuid() or (applies() and uid == UID)


def userns_fd() -> int:
    """A file descriptor of a user namespace mapping 0 to :data:`UID` (and 0 to
    :data:`GID`): the id map of the view's mounts. Made once per process; call it before
    this process enters a new PID namespace (the child that makes it would be that
    namespace's init). OSError when it cannot be made."""
    global _userns
    if _userns is not None:
        return _userns
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child only unshares and waits
        code = 1
        try:
            os.close(ready_r)
            os.close(done_w)
            if _c().unshare(CLONE_NEWUSER) == 0:
                os.write(ready_w, b"u")
                os.read(done_r, 1)
                code = 0
        finally:
            os._exit(code)
    os.close(ready_w)
    os.close(done_r)
    try:
        if os.read(ready_r, 1) != b"u":
            raise OSError(1, "the id map's user namespace could not be made")
        for name, text in (
            ("uid_map", f"0 {UID} 1\n"),
            ("setgroups", "deny"),
            ("gid_map", f"0 {GID} 1\n"),
        ):
            with open(f"/proc/{pid}/{name}", "w", encoding="ascii") as f:
                f.write(text)
        _userns = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(ready_r)
        os.close(done_w)  # the child reads EOF and exits
        with contextlib.suppress(ChildProcessError):  # (reaped already where SIGCHLD is ignored)
            os.waitpid(pid, 0)
    return _userns


def held() -> tuple[int, ...]:
    """The descriptors this module keeps open (a process closing every other fd keeps
    these)."""
    return () if _userns is None else (_userns,)


def bind(source: str, target: str, *, readonly: bool) -> None:
    """Bind ``source`` (recursively) at ``target``, id-mapped through :func:`userns_fd`;
    OSError names the step that failed."""
    c = _c()
    tree = _check(
        c.syscall(
            _SYS["open_tree"],
            AT_FDCWD,
            source.encode(),
            OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE,
        ),
        f"id-mapped mount of {target} (open_tree)",
    )
    try:
        attr_set = MOUNT_ATTR_IDMAP | (MOUNT_ATTR_RDONLY if readonly else 0)
        attr = ctypes.create_string_buffer(struct.pack("QQQQ", attr_set, 0, 0, userns_fd()), 32)
        _check(
            c.syscall(_SYS["mount_setattr"], tree, b"", AT_EMPTY_PATH | AT_RECURSIVE, attr, 32),
            f"id-mapped mount of {target} (mount_setattr)",
        )
        _check(
            c.syscall(
                _SYS["move_mount"], tree, b"", AT_FDCWD, target.encode(), MOVE_MOUNT_F_EMPTY_PATH
            ),
            f"id-mapped mount of {target} (move_mount)",
        )
    finally:
        os.close(tree)


def become() -> None:
    """This process (the init, about to give up its capabilities) turns into :data:`UID`
    and :data:`GID` with no supplementary groups; OSError when it cannot."""
    os.setgroups([])
    os.setresgid(GID, GID, GID)
    os.setresuid(UID, UID, UID)
