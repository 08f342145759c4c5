"""The command's root filesystem: built from an allow-list in its own mount namespace
(Linux), the way bubblewrap builds one, through ctypes.

In the command's init (:mod:`endpointd.process.nsinit`), in two stages:

1. :func:`stage`, before the command is known, in the init's own mount namespace
   (:func:`endpointd.guard.namespaces.mount_proc`): a fresh tmpfs made ``/`` at once
   (``pivot_root``),
   the real root beneath it at :data:`OLD` to bind from, and in it what every command sees
   (the ``base`` operations: system directories read-only, a private ``/tmp``, a ``/dev``
   of its own, ``/proc``, the hidden home directory with its grants).
2. :func:`finish`, once the command's own operations are applied (its workspace
   read-write, its TMPDIR, its clone's git directory...): the real root and the staging
   area are covered and ``/`` turns read-only. Nothing outside the operations is reachable
   afterwards, by any path: not the owner's other files, not another terminal, not a Unix
   socket nobody granted.

Cheap by design, since a mount namespace is made and torn down per command: three
filesystems (the root tmpfs, ``/proc``, a ``devpts``); everything else is a bind (the
private ``/tmp``, ``/var/tmp`` and ``/dev/shm`` are directories of the root tmpfs bound in
place, masks are binds of one empty directory or file); nothing is unmounted on a
command's path (an unmount waits for an RCU grace period).

Each operation is ``[kind, path, arg]``, applied in the order given (parents first; the
daemon sorts them, :mod:`endpointd.guard.view`):

* ``sys``: bind the real ``path`` read-only at the same path (recursively: mounts beneath
  come along): a system directory;
* ``ro`` / ``rw``: the same for what the owner or the command is granted, read-only or
  not; id-mapped where the daemon runs as root (:mod:`endpointd.commanduser`: the
  command runs as ``nobody`` and owns what it was granted, nothing else);
* ``link``: a symlink to ``arg`` (``/bin -> usr/bin``);
* ``tmpfs``: an empty private directory of mode ``arg`` (octal), writable;
* ``dir``: an empty directory of mode ``arg``, read-only like the root (the home directory;
  the command's user owns it);
* ``mask``: nothing there: an empty read-only directory over a directory, an empty file no
  grant names over a file; what lies beneath a bound directory but must never be seen (a
  credential file);
* ``dev``: a ``/dev`` with the usual character devices, a fresh ``devpts`` instance (only
  the ptys the command opens itself) and a private ``/dev/shm``;
* ``proc``: a ``/proc`` of the init's PID namespace.

Standard library only (the supervisor runs in a bare interpreter).
"""

from __future__ import annotations

import os
import stat

from endpointd import commanduser
from endpointd.libc import check as _check
from endpointd.libc import libc as _c

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 0x4000
MS_RELATIME = 1 << 21
MNT_DETACH = 2
# statvfs flags (ST_*) that a bind remount must keep: in a user namespace the kernel
# refuses to clear them on a mount inherited from outside.
_KEEP = (
    (os.ST_NOSUID, MS_NOSUID),
    (os.ST_NODEV, MS_NODEV),
    (os.ST_NOEXEC, MS_NOEXEC),
    (os.ST_NOATIME, MS_NOATIME),
    (os.ST_NODIRATIME, MS_NODIRATIME),
    (os.ST_RELATIME, MS_RELATIME),
)

# In the view while it is staged: the real root (to bind from), and the staging area (the
# private directories, an empty directory and file for masks); both covered by finish().
OLD = "/.oldroot"
STAGING = "/.staging"
EMPTY = STAGING + "/empty"
MASK = STAGING + "/mask"
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    _check(
        _c().mount(
            source.encode() if source is not None else None,
            target.encode(),
            fstype.encode() if fstype is not None else None,
            flags,
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


def _pivot(new: str, old: str) -> None:
    _check(_c().syscall(_PIVOT_ROOT, new.encode(), old.encode()), "pivot_root")


# pivot_root has no libc wrapper everywhere; its number per architecture.
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "armv7l": 218, "ppc64le": 203}.get(
    os.uname().machine, 155
)

_staged: list[list[Any]] | None = None  # the base operations applied, once staged
_private = 0  # private directories made so far (their names in STAGING)


def stage(base: list[list[Any]]) -> None:
    """Stage 1 (see the module doc), in the init; OSError says what failed."""
    global _staged
    # (In the init's own mount namespace, made private by namespaces.mount_proc.)
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")  # noqa: S108
    os.mkdir("/tmp" + OLD, 0)  # noqa: S108
    _pivot("/tmp", "/tmp" + OLD)  # noqa: S108
    os.chdir("/")
    os.mkdir(STAGING, 0)
    os.mkdir(EMPTY, 0)
    os.close(os.open(MASK, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0))
    _staged = []
    apply(base)
    _staged = base


def restage(base: list[list[Any]]) -> None:
    """Stage 1 again, for a command whose base differs from what was staged ahead: what
    was mounted is taken away (unmounted: off the usual path, this is the rare case)."""
    global _staged
    if _staged is None:
        stage(base)
        return
    for kind, path, _ in reversed(_staged):
        if kind in ("sys", "ro", "rw", "tmpfs", "mask", "proc"):
            _check(_c().umount2(path.encode(), MNT_DETACH), f"umount {path}")
        elif kind == "dev":
            for name in ("shm", "pts", *DEVICES):
                _check(_c().umount2(f"{path}/{name}".encode(), MNT_DETACH), f"umount {path}")
    for name in os.listdir("/"):
        if "/" + name not in (OLD, STAGING):
            _remove("/" + name)
    _staged = []
    apply(base)
    _staged = base


def _remove(path: str) -> None:
    """What staging made on the root tmpfs (directories, links, files; no mounts left)."""
    if os.path.isdir(path) and not os.path.islink(path):
        for name in os.listdir(path):
            _remove(os.path.join(path, name))
        os.rmdir(path)
    else:
        os.unlink(path)


def apply(operations: list[list[Any]]) -> None:
    """The operations (see the module doc) in the staged view, in order."""
    for kind, path, arg in operations:
        source = OLD + path
        if kind in ("sys", "ro", "rw"):
            try:
                st = os.stat(source)
            except OSError:
                continue  # gone since it was planned: nothing to see
            _mountpoint(path, directory=stat.S_ISDIR(st.st_mode))
            if kind != "sys" and commanduser.applies():
                commanduser.bind(source, path, readonly=kind == "ro")
                continue
            _mount(source, path, None, MS_BIND | MS_REC)
            if kind != "rw":
                _readonly(path)
        elif kind == "link":
            _parents(path)
            if not os.path.lexists(path):
                os.symlink(arg, path)
        elif kind == "tmpfs":
            _mountpoint(path, directory=True)
            _mount(_private_dir(int(arg, 8)), path, None, MS_BIND)
        elif kind == "dir":
            _mountpoint(path, directory=True)
            os.chmod(path, int(arg, 8))
            if commanduser.applies():
                os.chown(path, commanduser.UID, commanduser.GID)
        elif kind == "mask":
            _mask(path)
        elif kind == "dev":
            _dev(path)
        elif kind == "proc":
            _mountpoint(path, directory=True)
            _mount("proc", path, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        else:
            raise OSError(22, f"unknown view operation {kind!r}")


def finish() -> None:
    """Stage 2 (see the module doc): the real root and the staging area covered by an
    empty read-only directory, the root read-only (only the private directories and the
    read-write binds within it can be written).

    Covered rather than unmounted: an unmount waits for an RCU grace period (milliseconds
    on a busy VM, on every command's path), a mount does not. Nothing reaches what is
    covered: no path leads there, and a Landlock-confined process (every command in a
    view) may not unmount, mount or pivot anything.
    """
    for path in (OLD, STAGING):
        _mount(EMPTY, path, None, MS_BIND)
        _readonly(path)
    _mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir("/")


def leave() -> None:
    """For an unconfined command in a staged init: back to the real root (chroot)."""
    os.chdir(OLD)
    os.chroot(".")
    os.chdir("/")


def beside(
    areas: list[list[Any]], base: list[list[Any]], command: list[list[Any]]
) -> list[tuple[str, int]]:
    """Landlock grants for the private areas (``[path, rights]``): ``rights`` on what lies
    there, except the mounts made beneath them and what is on the way to those, which may
    only be listed (so a workspace bound beneath ``/tmp`` keeps its own grants, and
    ``/tmp``'s do not reach it)."""
    mounted = {op[1] for op in (*base, *command)}
    out: list[tuple[str, int]] = []
    for path, rights in areas:
        inner = [m for m in mounted if m.startswith(path.rstrip("/") + "/")]
        out += _beside(path, int(rights), inner)
    return out


def _beside(path: str, rights: int, inner: list[str]) -> list[tuple[str, int]]:
    if not inner:
        return [(path, rights)]
    out = [(path, _READ_DIR)]
    try:
        names = os.listdir(path)
    except OSError:
        return out
    for name in names:
        child = path.rstrip("/") + "/" + name
        if child in inner:
            continue  # a mount of its own, with its own grants
        out += _beside(child, rights, [m for m in inner if m.startswith(child + "/")])
    return out


_READ_DIR = 1 << 3  # (landlock.READ_DIR)


def _private_dir(mode: int) -> str:
    global _private
    _private += 1
    path = f"{STAGING}/{_private}"
    os.mkdir(path)
    os.chmod(path, mode)  # (past the umask)
    return path


def _parents(target: str) -> None:
    parent = os.path.dirname(target)
    if not os.path.isdir(parent):
        os.makedirs(parent, 0o755, exist_ok=True)


def _mountpoint(target: str, *, directory: bool) -> None:
    _parents(target)
    if directory:
        if not os.path.isdir(target):
            os.mkdir(target, 0o755)
    elif not os.path.lexists(target):
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))


def _readonly(target: str) -> None:
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY
    have = os.statvfs(target).f_flag
    for st_flag, ms_flag in _KEEP:
        if have & st_flag:
            flags |= ms_flag
    _mount(None, target, None, flags)


def _mask(target: str) -> None:
    if not os.path.lexists(target) or os.path.islink(target):
        return  # not in view anyway
    if os.path.isdir(target):
        _mount(EMPTY, target, None, MS_BIND)
        _readonly(target)
    else:
        _mount(MASK, target, None, MS_BIND)


def _dev(target: str) -> None:
    _mountpoint(target, directory=True)
    for name in DEVICES:
        path = os.path.join(target, name)
        if os.path.exists(OLD + "/dev/" + name):
            _mountpoint(path, directory=False)
            _mount(OLD + "/dev/" + name, path, None, MS_BIND)
    for name, to in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("ptmx", "pts/ptmx"),
    ):
        os.symlink(to, os.path.join(target, name))
    pts = os.path.join(target, "pts")
    os.mkdir(pts, 0o755)
    # A devpts of its own: the command's own ptys only, never the owner's terminals.
    _mount("devpts", pts, "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620")
    shm = os.path.join(target, "shm")
    os.mkdir(shm, 0o755)
    _mount(_private_dir(0o1777), shm, None, MS_BIND)
