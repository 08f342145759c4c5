"""No set-user-ID or set-group-ID file made by a command (Linux, seccomp through ctypes).

A command without capabilities (:mod:`endpointd.guard.capabilities`) still owns what it
writes, and an owner may set the set-user-ID bit on its own file without any privilege. A
root daemon's command could so leave a set-user-ID *root* program in a workspace, which
anyone else who can reach it would run as root (``no_new_privs`` protects the command's own
tree only); a normal user's command, a program that runs as that user. This filter makes
every way of giving a file those bits fail with ``EPERM``:

* ``chmod``, ``fchmod``, ``fchmodat``, ``fchmodat2``, and ``open``, ``openat``, ``creat``,
  ``mknod``, ``mknodat`` (which take a mode for a file they create) when the mode holds
  ``S_ISUID`` or ``S_ISGID``;
* ``openat2`` outright, as if the kernel had none (``ENOSYS``: its mode sits in a struct the
  filter cannot read, and its callers fall back to ``openat``), and ``io_uring`` (its
  operations open files without system calls a filter sees).

Both of a machine's system call ABIs are covered (x86_64 with x32, and i386; aarch64 and
arm), each with its own numbers. Installed with ``PR_SET_SECCOMP`` once ``no_new_privs`` is
set, for good, by :func:`endpointd.guard.capabilities.drop_all`. Standard library only.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys

from endpointd.libc import libc

_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_RET_ALLOW = 0x7FFF0000
_RET_EPERM = 0x00050000 | errno.EPERM
_RET_ENOSYS = 0x00050000 | errno.ENOSYS
_LD_W_ABS, _JEQ, _AND, _RET = 0x20, 0x15, 0x54, 0x06
_NR, _ARCH, _ARGS = 0, 4, 16  # offsets in struct seccomp_data (low words, little-endian)
_SETID = 0o6000
_X32_BIT = 0x40000000

# Per ABI: its AUDIT_ARCH value, and {system call number: index of its mode argument}.
_X86_64 = (0xC000003E, {90: 1, 91: 1, 268: 2, 452: 2, 85: 1, 2: 2, 257: 3, 133: 1, 259: 2})
_I386 = (0x40000003, {15: 1, 94: 1, 306: 2, 452: 2, 8: 1, 5: 2, 295: 3, 14: 1, 297: 2})
_AARCH64 = (0xC00000B7, {52: 1, 53: 2, 452: 2, 56: 3, 33: 2})
_ARM = (0x40000028, {15: 1, 94: 1, 333: 2, 452: 2, 8: 1, 5: 2, 322: 3, 14: 1, 324: 2})
_ABIS = {"x86_64": (_X86_64, _I386), "aarch64": (_AARCH64, _ARM)}
# io_uring_setup, io_uring_enter, io_uring_register: the same on every ABI here.
_REFUSED = (425, 426, 427)
# openat2, also everywhere: ENOSYS, on which its callers fall back to openat.
_OPENAT2 = 437


class _Filter(ctypes.Structure):
    _fields_ = (
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    )


class _Program(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Filter)))


def _abis() -> tuple[tuple[int, dict[int, int]], ...] | None:
    if sys.platform != "linux" or sys.byteorder != "little":
        return None
    if ctypes.sizeof(ctypes.c_void_p) != 8:
        return None
    return _ABIS.get(os.uname().machine)


def program() -> list[tuple[int, int, int, int]] | None:
    """The filter as (code, jt, jf, k) instructions; None where the ABI is unknown."""
    abis = _abis()
    if abis is None:
        return None
    ops: list[tuple[int, int | str, int | str, int]] = []
    labels: dict[str, int] = {}

    def op(code: int, k: int, jt: int | str = 0, jf: int | str = 0) -> None:
        ops.append((code, jt, jf, k))

    op(_LD_W_ABS, _ARCH)
    for i, (audit, _) in enumerate(abis):
        op(_JEQ, audit, jt=f"abi{i}")
    op(_RET, _RET_ALLOW)  # (no other ABI reaches this kernel's system calls)
    for i, (audit, calls) in enumerate(abis):
        labels[f"abi{i}"] = len(ops)
        op(_LD_W_ABS, _NR)
        if audit == _X86_64[0]:
            op(_AND, 0xFFFFFFFF ^ _X32_BIT)  # x32: the x86_64 numbers plus this bit
        for nr in _REFUSED:
            op(_JEQ, nr, jt="deny")
        op(_JEQ, _OPENAT2, jt="nosys")
        for nr, arg in sorted(calls.items()):
            op(_JEQ, nr, jt=f"mode{arg}")
        op(_RET, _RET_ALLOW)
    for arg in sorted({arg for _, calls in abis for arg in calls.values()}):
        labels[f"mode{arg}"] = len(ops)
        op(_LD_W_ABS, _ARGS + 8 * arg)  # mode_t is 32 bits: the low word is all of it
        op(_AND, _SETID)
        op(_JEQ, 0, jt="allow", jf="deny")
    labels["allow"] = len(ops)
    op(_RET, _RET_ALLOW)
    labels["deny"] = len(ops)
    op(_RET, _RET_EPERM)
    labels["nosys"] = len(ops)
    op(_RET, _RET_ENOSYS)

    def offset(here: int, target: int | str) -> int:
        return target if isinstance(target, int) else labels[target] - here - 1

    return [(code, offset(i, jt), offset(i, jf), k) for i, (code, jt, jf, k) in enumerate(ops)]


# Built once per process, ahead of the command where possible (see prepare).
_built: tuple[ctypes.CDLL, _Program, ctypes.Array[_Filter]] | None = None


def prepare() -> None:
    """Build the filter (most of what installing it costs), e.g. while an init waits."""
    global _built
    if _built is not None:
        return
    instructions = program()
    if instructions is None:
        return
    filters = (_Filter * len(instructions))(*(_Filter(*ins) for ins in instructions))
    prog = _Program(len(instructions), ctypes.cast(filters, ctypes.POINTER(_Filter)))
    _built = (libc(), prog, filters)


def install() -> None:
    """Filter this process (and all it starts) for good; ``no_new_privs`` must be set.
    Nothing where the ABI is unknown (the other layers still hold). OSError on failure."""
    prepare()
    if _built is None:
        return
    libc, prog, _ = _built
    zero = ctypes.c_ulong(0)
    mode = ctypes.c_ulong(_SECCOMP_MODE_FILTER)
    if libc.prctl(_PR_SET_SECCOMP, mode, ctypes.byref(prog), zero, zero) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"seccomp (no set-id files): {os.strerror(err)}")
