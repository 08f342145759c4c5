"""Landlock, the Linux kernel's unprivileged sandbox, through its three system calls.

A process restricts itself, and everything it starts afterwards, to a ruleset: which file
hierarchies it may read and which it may write (ABI 1+), which TCP ports it may connect to
or bind (ABI 4+), and (ABI 6+) that it may neither signal nor reach through abstract Unix
sockets any process outside its own domain (the daemon, other commands). The kernel
enforces it; nothing a command does from inside can loosen it, and no privilege is needed.

Only the rights the running kernel knows are asked for (``abi_version``): an older kernel
enforces less, and :meth:`Ruleset.unenforced` says what, so a caller whose policy requires
it can refuse the command instead of running it less confined.

Called in the child between fork and exec (or in a process that is about to exec the
command); ``PR_SET_NO_NEW_PRIVS`` is set first, as the kernel requires.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import sys

from endpointd.libc import libc

# Not `typing.TYPE_CHECKING` nor dataclasses: the supervisor imports this once per command,
# and those imports alone would cost it milliseconds.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

# Generic syscall table numbers: the same on x86_64 and aarch64.
_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_RULE_NET_PORT = 2
_PR_SET_NO_NEW_PRIVS = 38

# Filesystem rights, by the ABI that introduced them.
EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13  # ABI 2: moving or linking a file between directories
TRUNCATE = 1 << 14  # ABI 3
IOCTL_DEV = 1 << 15  # ABI 5
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
READ = EXECUTE | READ_FILE | READ_DIR
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV  # what a file rule may hold
# Network (ABI 4) and scopes (ABI 6).
BIND_TCP = 1 << 0
CONNECT_TCP = 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
SCOPE_SIGNAL = 1 << 1


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _NetPortAttr(ctypes.Structure):
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


class LandlockError(OSError):
    """The kernel refused the ruleset (or has no Landlock)."""


def _libc() -> ctypes.CDLL:
    return libc()


def abi_version() -> int:
    """The Landlock ABI the running kernel offers; 0 when it has none (or is not Linux)."""
    if not sys.platform.startswith("linux"):
        return 0
    version = _libc().syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION)
    return max(int(version), 0)


class Ruleset:
    """What a confined process may do; everything the running ABI handles and this does
    not grant is denied."""

    __slots__ = ("bind_ports", "connect_ports", "read", "scoped", "write")

    def __init__(
        self,
        read: Sequence[str] = (),
        write: Sequence[str] = (),
        connect_ports: Sequence[int] | None = None,
        bind_ports: Sequence[int] | None = (),
        scoped: bool = True,
    ) -> None:
        self.read = read  # hierarchies it may read and execute from
        self.write = write  # hierarchies it may also write, create and remove in
        self.connect_ports = connect_ports  # TCP ports it may connect to; None: any
        self.bind_ports = bind_ports  # TCP ports it may bind; None: any
        self.scoped = scoped  # no signals, no abstract Unix sockets beyond its own domain

    def unenforced(self, abi: int) -> list[str]:
        """What this ruleset asks for that a kernel with ``abi`` cannot enforce."""
        missing = []
        if abi < 1:
            return ["Landlock (this kernel has none)"]
        if abi < 4 and (self.connect_ports is not None or self.bind_ports is not None):
            missing.append("TCP port rules (Landlock ABI 4)")
        if abi < 6 and self.scoped:
            missing.append("signal and abstract-socket scoping (Landlock ABI 6)")
        return missing


def _fs_rights(abi: int) -> int:
    return _FS_BY_ABI[max(v for v in _FS_BY_ABI if v <= abi)]


def restrict_self(rules: Ruleset) -> None:
    """Confine this process and its future children to ``rules``, for good.

    Raises :class:`LandlockError` when the kernel has no Landlock or refuses a rule (a path
    that does not exist is skipped: there is nothing under it to grant).
    """
    enforce(create(rules))


def create(
    rules: Ruleset, grants: Sequence[tuple[str, int]] = (), *, filesystem: bool = True
) -> int:
    """Build the kernel ruleset for ``rules`` plus explicit ``grants`` (path, rights; a
    path is opened without following a final symlink, so a link never carries a grant to
    its target); returns its fd, for :func:`enforce` (e.g. in a child after fork), and
    :func:`add` can still grant more until then. ``filesystem=False``: a ruleset for
    ``rules``' ports only (a layer of its own, enforced on top of another)."""
    abi = abi_version()
    if abi < 1:
        raise LandlockError(errno.ENOSYS, "this kernel has no Landlock")
    libc = _libc()
    handled_fs = _fs_rights(abi) if filesystem else 0
    attr = _RulesetAttr(handled_access_fs=handled_fs)
    size = 8
    if abi >= 4:
        net = (CONNECT_TCP if rules.connect_ports is not None else 0) | (
            BIND_TCP if rules.bind_ports is not None else 0
        )
        attr.handled_access_net = net
        size = 16
    if abi >= 6:
        scoped = rules.scoped and filesystem  # (a ports-only layer adds nothing here)
        attr.scoped = (SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL) if scoped else 0
        size = 24
    fd = libc.syscall(_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0)
    if fd < 0:
        raise LandlockError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        for path, rights in [
            *((p, READ) for p in rules.read),
            *((p, handled_fs) for p in rules.write),
        ]:
            _allow_beneath(libc, fd, path, rights & handled_fs, follow=True)
        _add(libc, fd, grants, handled_fs)
        if abi >= 4:
            for port in rules.connect_ports or ():
                _allow_port(libc, fd, port, CONNECT_TCP)
            for port in rules.bind_ports or ():
                _allow_port(libc, fd, port, BIND_TCP)
    except BaseException:
        os.close(fd)
        raise
    return int(fd)


def add(ruleset_fd: int, grants: Sequence[tuple[str, int]]) -> None:
    """More ``grants`` (as :func:`create`'s) for a filesystem ruleset not yet enforced."""
    _add(_libc(), ruleset_fd, grants, _fs_rights(abi_version()))


def _add(libc: ctypes.CDLL, fd: int, grants: Sequence[tuple[str, int]], handled: int) -> None:
    for path, rights in grants:
        _allow_beneath(libc, fd, path, rights & handled, follow=False)


def enforce(ruleset_fd: int) -> None:
    """Confine this process (and what it starts) to a ruleset from :func:`create`; closes
    the fd. Only system calls: safe in a child between fork and exec."""
    libc = _libc()
    try:
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise LandlockError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if libc.syscall(_RESTRICT_SELF, ruleset_fd, 0) != 0:
            raise LandlockError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset_fd)


def _allow_beneath(libc: ctypes.CDLL, ruleset: int, path: str, rights: int, follow: bool) -> None:
    flags = os.O_PATH | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        parent = os.open(path, flags)
    except (FileNotFoundError, NotADirectoryError):
        return
    try:
        st = os.fstat(parent)
        if stat.S_ISLNK(st.st_mode):
            return  # a grant on a link would mean nothing; its target has its own
        if not stat.S_ISDIR(st.st_mode):
            rights &= FILE_RIGHTS  # the kernel refuses directory rights on a file
        rule = _PathBeneathAttr(allowed_access=rights, parent_fd=parent)
        if libc.syscall(_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0) != 0:
            raise LandlockError(ctypes.get_errno(), f"landlock_add_rule({path}) failed")
    finally:
        os.close(parent)


def _allow_port(libc: ctypes.CDLL, ruleset: int, port: int, right: int) -> None:
    rule = _NetPortAttr(allowed_access=right, port=port)
    if libc.syscall(_ADD_RULE, ruleset, _RULE_NET_PORT, ctypes.byref(rule), 0) != 0:
        raise LandlockError(ctypes.get_errno(), f"landlock_add_rule(port {port}) failed")
