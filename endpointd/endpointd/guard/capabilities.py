"""No capability for a command, whoever runs the daemon (Linux), through ctypes.

A daemon run as root (CI runs as root; so does a daemon started from a root shell) gave
its commands every capability: ``CapEff 0x1fffeffffff``, enough to ``mknod`` a disk device
in the workspace, load a kernel module, or reconfigure the namespace the sandbox built.
The sandbox's other layers assume an unprivileged process. So, as the last step before it
confines itself and starts the command, the process that starts it (a namespace's init,
:mod:`endpointd.process.nsinit`) gives up every capability for good:

1. securebits ``NOROOT``, ``NO_SETUID_FIXUP`` and ``NO_CAP_AMBIENT_RAISE``, each locked,
   and ``KEEP_CAPS`` locked off: an ``exec`` by uid 0, or of a setuid-root or file-capability
   program, grants nothing, and nothing can undo that;
2. every capability out of the bounding set (nothing can ever be regained by an exec);
3. the ambient set cleared, then effective, permitted and inheritable emptied (``capset``);
4. ``no_new_privs``;
5. no file made set-user-ID or set-group-ID (:mod:`endpointd.guard.nosuid`): without a
   capability, owning a file still lets one set those bits, and a set-user-ID root program
   left in a workspace would run as root for anyone else.

The first two need ``CAP_SETPCAP``. A normal user's daemon has it in the user namespace
the sandbox makes (:mod:`endpointd.guard.namespaces`); a root daemon needs it for real,
which :func:`unavailable_reason` checks so that ``sandbox = "required"`` refuses with one
line instead of running a privileged command. Nor does a root daemon's command keep uid 0,
which owns most of the machine: in its view it runs as ``nobody``
(:mod:`endpointd.commanduser`).

Standard library only (the init runs in a bare interpreter).
"""

from __future__ import annotations

import ctypes
import os
import sys

from endpointd.guard import nosuid
from endpointd.libc import libc as _c

_PR_CAPBSET_DROP = 24
_PR_SET_SECUREBITS = 28
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_CAP_SETPCAP = 8

_SECBIT_NOROOT = 1 << 0
_SECBIT_NOROOT_LOCKED = 1 << 1
_SECBIT_NO_SETUID_FIXUP = 1 << 2
_SECBIT_NO_SETUID_FIXUP_LOCKED = 1 << 3
_SECBIT_KEEP_CAPS_LOCKED = 1 << 5
_SECBIT_NO_CAP_AMBIENT_RAISE = 1 << 6
_SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED = 1 << 7
SECUREBITS = (
    _SECBIT_NOROOT
    | _SECBIT_NOROOT_LOCKED
    | _SECBIT_NO_SETUID_FIXUP
    | _SECBIT_NO_SETUID_FIXUP_LOCKED
    | _SECBIT_KEEP_CAPS_LOCKED
    | _SECBIT_NO_CAP_AMBIENT_RAISE
    | _SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED
)


class _Header(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _Data(ctypes.Structure):
    _fields_ = (
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    )


def _prctl(what: str, option: int, arg: int = 0) -> None:
    zero = ctypes.c_ulong(0)
    if _c().prctl(option, ctypes.c_ulong(arg), zero, zero, zero) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap", "rb") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 63  # dropping a capability the kernel does not know fails: see drop_all


_locked = False


def prepare() -> None:
    """Steps 1 and 2 of the module doc, which cost most (a system call per capability) and
    take nothing this process still uses (they bind what an ``exec`` gets): a namespace's
    init does them while it waits for its command. OSError when a step fails."""
    global _locked
    if _locked:
        return
    nosuid.prepare()
    if os.geteuid() != 0 and not _permitted():
        # A normal user's process outside any user namespace (the sandbox without one, under
        # best-effort): it has nothing to give up, nor the right to lock the bits, and with
        # no_new_privs no exec grants it anything.
        _locked = True
        return
    _prctl("securebits", _PR_SET_SECUREBITS, SECUREBITS)
    for cap in range(_last_cap() + 1):
        _prctl(f"dropping capability {cap} from the bounding set", _PR_CAPBSET_DROP, cap)
    _locked = True


def _permitted() -> int:
    """This process's permitted capabilities (a bit mask; all of them if capget fails)."""
    header = _Header(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_Data * 2)()
    if _c().capget(ctypes.byref(header), data) != 0:
        return -1
    return int(data[0].permitted) | int(data[1].permitted) << 32


def drop_all() -> None:
    """Give up every capability of this process and of all it will ever run (module doc).
    OSError when a step fails: the caller must not start the command then."""
    prepare()
    _prctl("clearing the ambient capabilities", _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL)
    header = _Header(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_Data * 2)()
    if _c().capset(ctypes.byref(header), data) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"capset: {os.strerror(err)}")
    _prctl("no_new_privs", _PR_SET_NO_NEW_PRIVS, 1)
    # Owning a file is enough to make it set-user-ID: see guard/nosuid.py.
    nosuid.install()


def unavailable_reason() -> str:
    """Why commands could keep a capability here ("" when :func:`drop_all` will work).

    Only a root daemon can fall short: it drops its own capabilities, without the user
    namespace that gives a normal user's sandbox ``CAP_SETPCAP``, so it needs that
    capability for real (a container may have taken it away).
    """
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return ""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        effective = int(fields["CapEff"].strip(), 16)
    except (OSError, KeyError, ValueError) as exc:
        return f"endpointd runs as root and cannot read its capabilities: {exc}"
    if not effective >> _CAP_SETPCAP & 1:
        return (
            "dropping a root command's capabilities (endpointd runs as root without"
            " CAP_SETPCAP; run it as a normal user)"
        )
    return ""
