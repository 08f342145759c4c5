"""A seccomp-bpf filter that keeps a command off the network Landlock cannot see.

Landlock confines files, TCP ports and signals, but has no say over UDP, raw, netlink or
packet sockets, nor over io_uring. This module installs a small classic-BPF program that
the kernel runs on every system call of the calling thread group (and, inherited across
fork and exec, of everything it starts), for good: a filter can be added but never removed.

* ``"deny"``: ``socket()`` and ``socketpair()`` fail with EPERM for every domain but
  AF_UNIX (local programs need it: D-Bus, ssh-agent, the git helper's socket).
* ``"proxy"``: as ``"deny"``, except that TCP over IPv4 or IPv6 is allowed; Landlock then
  limits where such a socket may connect (the proxy's port).
* Both: ``io_uring_setup/enter/register`` fail with EPERM, because io_uring operations
  (including its own socket and connect opcodes) happen without system calls seccomp sees.

It filters socket *creation* only: a network socket passed in over AF_UNIX or inherited
across exec is not caught here, so the caller closes every descriptor it does not mean to
hand on (the supervisor does).

Called in the child between fork and exec, after ``PR_SET_NO_NEW_PRIVS`` (set again here:
it is idempotent, and the kernel refuses an unprivileged filter without it). Standard
library only and cheap to import, since the daemon runs it in a bare ``python -I -S``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys

from endpointd.libc import libc

# The kernel ABI, spelled out rather than taken from `socket`: these are Linux's numbers,
# identical on every architecture this module supports.
_AF_UNIX, _AF_INET, _AF_INET6 = 1, 2, 10
_SOCK_STREAM = 1
_SOCK_TYPE_MASK = 0xF  # the type without SOCK_NONBLOCK / SOCK_CLOEXEC
_IPPROTO_TCP = 6
_IO_URING_FIRST, _IO_URING_END = 425, 428  # setup, enter, register: the generic table

_PR_SET_NO_NEW_PRIVS = 38
_PR_GET_SECCOMP = 21
_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_FILTER_FLAG_TSYNC = 1

_SECCOMP_RET_KILL_PROCESS = 0x80000000
_SECCOMP_RET_ERRNO = 0x00050000
_SECCOMP_RET_ALLOW = 0x7FFF0000

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6].
_NR, _ARCH = 0, 4
_ARG0, _ARG1, _ARG2 = 16, 24, 32  # the low word of args[0..2]: see _program

# Classic BPF opcodes (linux/bpf_common.h), the few the program uses.
_LD_W_ABS = 0x20  # A = the 32-bit word at offset k of seccomp_data
_JEQ = 0x15  # pc += (A == k) ? jt : jf
_JGE = 0x35  # pc += (A >= k) ? jt : jf, unsigned
_AND = 0x54  # A &= k
_RET = 0x06  # return k

_X32_SYSCALL_BIT = 0x40000000


class _Arch:
    """What the filter needs to know of one architecture's system call ABI."""

    def __init__(self, audit: int, socket: int, socketpair: int, seccomp: int) -> None:
        self.audit = audit  # AUDIT_ARCH_*: what seccomp_data.arch holds for native calls
        self.socket = socket
        self.socketpair = socketpair
        self.seccomp = seccomp  # the seccomp(2) system call itself
        # x86_64 also accepts x32 calls under the same AUDIT_ARCH, told apart only by
        # this bit in the number; they would bypass every number the filter checks.
        self.x32_bit = audit == 0xC000003E


_ARCHES = {
    "x86_64": _Arch(audit=0xC000003E, socket=41, socketpair=53, seccomp=317),
    # AUDIT_ARCH_AARCH64 carries __AUDIT_ARCH_LE: matching it also rules out big-endian
    # callers, whose argument words would sit at the other offsets.
    "aarch64": _Arch(audit=0xC00000B7, socket=198, socketpair=199, seccomp=277),
}

MODES = ("deny", "proxy")


class SeccompError(OSError):
    """The filter could not be installed (or this system cannot have one)."""


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _libc() -> ctypes.CDLL:
    return libc()


def _arch() -> _Arch | None:
    """This interpreter's architecture, if the filter knows it.

    The kernel's machine name is not enough: a 32-bit (or x32) Python on a 64-bit kernel
    makes its system calls through another ABI, and the filter would kill it at once.
    """
    if sys.platform != "linux" or sys.byteorder != "little":
        return None
    if ctypes.sizeof(ctypes.c_void_p) != 8:
        return None
    return _ARCHES.get(os.uname().machine)


def supported() -> bool:
    """Whether seccomp filters can be installed here (Linux on x86_64 or aarch64)."""
    if _arch() is None:
        return False
    # EINVAL when the kernel was built without seccomp; 0 (none) or 2 (filtered) otherwise.
    return int(_libc().prctl(_PR_GET_SECCOMP, ctypes.c_ulong(0), 0, 0, 0)) >= 0


def _program(network: str, arch: _Arch) -> list[tuple[int, int, int, int]]:
    """The filter, as (code, jt, jf, k) instructions.

    Jump targets are written as labels and resolved at the end (classic BPF jumps only
    forward, by an offset); the verdicts come last so that every jump reaches them.
    """
    if network not in MODES:
        raise SeccompError(errno.EINVAL, f"unknown network mode {network!r}")
    ops: list[tuple[int, int | str, int | str, int]] = []
    labels: dict[str, int] = {}

    def op(code: int, k: int, jt: int | str = 0, jf: int | str = 0) -> None:
        ops.append((code, jt, jf, k))

    def label(name: str) -> None:
        labels[name] = len(ops)

    # A call made through another ABI (i386 `int 0x80` on x86_64, arm32 on aarch64) has
    # its own numbering, where the numbers below mean other calls: kill it outright.
    op(_LD_W_ABS, _ARCH)
    op(_JEQ, arch.audit, jf="kill")
    op(_LD_W_ABS, _NR)
    if arch.x32_bit:
        # x32 shares AUDIT_ARCH_X86_64; its numbers are the x86_64 ones plus this bit, so
        # `socket | 0x40000000` would otherwise slip past the check for `socket`.
        op(_JGE, _X32_SYSCALL_BIT, jt="kill")
    op(_JEQ, arch.socket, jt="socket")
    op(_JEQ, arch.socketpair, jt="socket")
    # io_uring_setup, io_uring_enter and io_uring_register are 425, 426, 427.
    op(_JGE, _IO_URING_FIRST, jf="allow")
    op(_JGE, _IO_URING_END, jt="allow", jf="deny")

    label("socket")
    # The arguments are 64-bit but BPF loads 32-bit words, so the low half is loaded
    # (offsets 16, 24, 32 on little-endian). That is the whole value: domain, type and
    # protocol are C ints, and the kernel truncates each register to int before using it,
    # so whatever sits in the high half cannot change what socket() does.
    op(_LD_W_ABS, _ARG0)
    if network == "deny":
        op(_JEQ, _AF_UNIX, jt="allow", jf="deny")
    else:
        op(_JEQ, _AF_UNIX, jt="allow")
        op(_JEQ, _AF_INET, jt="ip")
        op(_JEQ, _AF_INET6, jt="ip", jf="deny")  # netlink, packet, vsock, bluetooth...
        label("ip")
        op(_LD_W_ABS, _ARG1)
        op(_AND, _SOCK_TYPE_MASK)
        op(_JEQ, _SOCK_STREAM, jf="deny")  # UDP, ICMP, raw IP
        # A stream socket can also be SCTP or MPTCP, which Landlock's TCP port rules do
        # not cover: only the default protocol (TCP) and IPPROTO_TCP itself pass.
        op(_LD_W_ABS, _ARG2)
        op(_JEQ, 0, jt="allow")
        op(_JEQ, _IPPROTO_TCP, jt="allow", jf="deny")

    label("allow")
    op(_RET, _SECCOMP_RET_ALLOW)
    label("deny")
    op(_RET, _SECCOMP_RET_ERRNO | errno.EPERM)
    label("kill")
    op(_RET, _SECCOMP_RET_KILL_PROCESS)

    def offset(here: int, target: int | str) -> int:
        return target if isinstance(target, int) else labels[target] - here - 1

    return [(code, offset(i, jt), offset(i, jf), k) for i, (code, jt, jf, k) in enumerate(ops)]


def install(network: str) -> None:
    """Filter this process's system calls, and its future children's, for good.

    ``network`` is ``"deny"`` (AF_UNIX sockets only) or ``"proxy"`` (also TCP over IPv4
    and IPv6). Every thread of the process is filtered (TSYNC), so a helper thread started
    earlier is no way around it. Raises :class:`SeccompError` when the mode is unknown,
    seccomp is not available, or the kernel refuses the filter; then nothing is installed.
    """
    arch = _arch()
    if arch is None:
        raise SeccompError(errno.ENOSYS, "seccomp filters are not supported here")
    program = _program(network, arch)
    filters = (_SockFilter * len(program))(*(_SockFilter(*ins) for ins in program))
    fprog = _SockFprog(len(program), ctypes.cast(filters, ctypes.POINTER(_SockFilter)))
    libc = _libc()
    one, zero = ctypes.c_ulong(1), ctypes.c_ulong(0)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, one, zero, zero, zero) != 0:
        raise SeccompError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    done = libc.syscall(
        ctypes.c_long(arch.seccomp),
        ctypes.c_ulong(_SECCOMP_SET_MODE_FILTER),
        ctypes.c_ulong(_SECCOMP_FILTER_FLAG_TSYNC),
        ctypes.byref(fprog),
    )
    if done < 0:
        raise SeccompError(ctypes.get_errno(), "seccomp(SECCOMP_SET_MODE_FILTER) failed")
    if done > 0:  # TSYNC: the id of a thread that could not be synchronised
        raise SeccompError(errno.EAGAIN, f"seccomp could not filter thread {done}")
