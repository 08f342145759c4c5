"""A private PID namespace and /proc for each command (Linux), through ctypes.

Landlock stops a command from reading other processes' memory, but not their
``/proc/PID/environ``: on this kernel family that file stays readable to any process of the
same user, sandboxed or not. A command that could list the daemon's or another command's
environment would read what the daemon inherited (a login shell's ``AWS_SECRET_ACCESS_KEY``)
and the credentials delivered to the other command. So each command runs in a PID namespace
of its own, with its own ``/proc`` mounted over the real one: it sees only its own process
tree, and there is no PID of anyone else's to name.

How (driven by :mod:`endpointd.process.nsinit`, usually before the command is known):

1. :func:`enter`, in the supervisor: ``unshare`` a new PID namespace (and, when not
   root, a user namespace mapping the user to itself, which is what grants the right to
   mount).
2. The supervisor forks: the new child is PID 1 of the namespace. :func:`mount_proc` takes
   a mount namespace of its own (mounts made private first, so nothing done inside
   propagates to the host) and mounts a fresh ``/proc`` there, and that process stays as
   the namespace's init (it reaps orphans; when it exits, the kernel ends everything left
   in the namespace).

Standard library only (the supervisor runs in a bare interpreter).
"""

from __future__ import annotations

import os
import sys

from endpointd.libc import check as _check
from endpointd.libc import libc as _c

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REC = 0x4000
MS_PRIVATE = 1 << 18


def enter() -> None:
    """Move this process's future children into a new PID namespace (and, when not root,
    a user namespace in which they may mount). The mount namespace is the init's own
    (:func:`mount_proc`): one per command, not two."""
    uid, gid = os.geteuid(), os.getegid()
    flags = CLONE_NEWPID
    if uid != 0:
        flags |= CLONE_NEWUSER
    _check(_c().unshare(flags), "unshare")
    if uid != 0:
        # Map the user to itself: files keep their owner, and the namespace's capabilities
        # (needed to mount /proc) reach nothing outside it.
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")


def mount_proc() -> None:
    """In PID 1 of the new namespace: a mount namespace of its own whose mounts do not
    propagate back, and there a /proc that shows this namespace only."""
    _check(_c().unshare(CLONE_NEWNS), "unshare(mount)")
    _check(_c().mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    _check(
        _c().mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None),
        "mount proc",
    )


MS_BIND = 4096


def hide(directories: list[str], files: list[str]) -> None:
    """In the command's mount namespace: an empty tmpfs over each directory and /dev/null
    over each file (Unix sockets, mostly) that exists, so nothing there can be reached by
    its path. Landlock cannot stop a connect() to a socket by path (ABI <= 7): the session
    bus (and through it systemd's user manager, which starts programs outside any
    sandbox), ssh-agent, gpg-agent, the X server and a container engine are hidden this way.
    """
    for directory in directories:
        if os.path.isdir(directory):
            _check(
                _c().mount(
                    b"tmpfs", directory.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=0700"
                ),
                f"hide {directory}",
            )
    for path in files:
        if os.path.exists(path) and not os.path.isdir(path):
            _check(_c().mount(b"/dev/null", path.encode(), None, MS_BIND, None), f"hide {path}")


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


_available: str | None = None
_PROBE = """
import os, sys
sys.path.append(sys.argv[1])
from endpointd.guard import namespaces
namespaces.enter()
inner = os.fork()
if inner == 0:
    try:
        namespaces.mount_proc()
        from endpointd.guard import mountview  # and an allow-listed view can be built
        mountview.stage([["tmpfs", "/tmp", "1777"], ["dev", "/dev", None], ["proc", "/proc", None]])
        mountview.finish()
        os._exit(0 if os.getpid() == 1 else 3)
    except BaseException as exc:
        print(exc, file=sys.stderr)
        os._exit(1)
_, status = os.waitpid(inner, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def unavailable_reason() -> str:
    """Why a child cannot get a private PID namespace and /proc here ("" when it can).

    Tried for real, once, in a fresh interpreter (a kernel setting or a security module may
    forbid user namespaces, and only trying tells; a fresh process rather than a fork, since
    the daemon's gRPC threads make forking it fragile).
    """
    global _available
    if _available is not None:
        return _available
    if not sys.platform.startswith("linux"):
        _available = f"no PID namespaces on {sys.platform}"
        return _available
    _available = probe(_PROBE)
    return _available


def available() -> bool:
    return not unavailable_reason()


def probe(script: str) -> str:
    """Run ``script`` (given the daemon's package root as ``argv[1]``) in a fresh, bare
    interpreter: "" if it exits 0, else its last line on stderr. Only trying tells what a
    kernel setting or a security module allows; a fresh process rather than a fork, since
    the daemon's gRPC threads make forking it fragile."""
    import subprocess  # here: the supervisor and the init import this module, never probe

    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", script, package_root],
            capture_output=True,
            text=True,
            timeout=20,
            env={},
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"the probe could not run: {exc}"
    said = done.stderr.strip().splitlines()
    return "" if done.returncode == 0 else (said[-1] if said else "the probe failed")
