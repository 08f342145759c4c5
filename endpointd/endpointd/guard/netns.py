"""A network namespace for each command under ``network = "deny"`` or ``"proxy"`` (Linux).

Landlock's network rule names a port, never an address: with it alone, a command under
``proxy`` connected straight to *any* address on the proxy's port (127.0.0.2, ``::1``, the
machine's own address), and every command saw the host's listening sockets in
``/proc/net/tcp``. A network namespace takes the host's network away whole:

* ``deny``: the namespace holds a loopback interface of its own and nothing else. No route
  leads out; a server the command starts on 127.0.0.1 is reached by the command alone.
* ``proxy``: the same, plus one way out. A TCP socket listening on ``127.0.0.1:PORT``
  *inside* the namespace (the address the command's ``HTTPS_PROXY`` names) is handed to
  the daemon's per-command proxy over a Unix socket (its *door*,
  :mod:`endpointd.secrets.proxy_door`), which accepts on it from the daemon's side: each
  connection the command makes to its proxy address lands in the proxy, and nothing else
  in the namespace leads anywhere. No relaying process sits between them.

How (driven by :mod:`endpointd.process.nsinit`):

1. :func:`prepare_ahead`, in a namespace's init while it waits for its command: a forked
   helper ``unshare``s a new network namespace, brings its loopback up and hands the
   init a descriptor of it, then exits. Making a namespace costs about a millisecond,
   bringing ``lo`` up often tens (it waits on the kernel's network lock, which the
   teardown of earlier namespaces holds), so it is done ahead; the helper, not the init,
   enters it, because the init cannot leave a namespace again should its command need
   the host's network after all (``allow``).
2. :func:`join`, in the init once the command is known: for ``proxy``, connect to the
   proxy's door first (the door is an abstract Unix socket, which lives in the host's
   namespace), then ``setns`` into the prepared namespace (or one made now), then listen on
   the proxy's address inside and pass that socket through the door.

Everything the command starts inherits the namespace. Standard library only (the init runs
in a bare interpreter).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import struct
import sys

from endpointd.guard import namespaces
from endpointd.libc import check as _check
from endpointd.libc import libc as _c

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_IFREQ = struct.Struct("16sH22x")
# What the init sends through the door with the listening socket.
DOOR_MESSAGE = b"L"

# The namespace made ahead by this init (a descriptor), or -1.
_ahead = -1


def wanted(confine: dict[str, Any] | None) -> str:
    """The namespace a command's spec asks for: "deny", "proxy" or "" (the host's)."""
    return str((confine or {}).get("netns") or "")


def loopback_up() -> None:
    """Bring this namespace's ``lo`` up (a new namespace has it down)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = _IFREQ.unpack(fcntl.ioctl(s, _SIOCGIFFLAGS, _IFREQ.pack(b"lo", 0)))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, _IFREQ.pack(b"lo", flags | _IFF_UP))


def make() -> int:
    """A new network namespace with its loopback up, as a descriptor (close-on-exec); this
    process stays where it is. A forked helper makes and enters it (see the module doc)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        pid = os.fork()
    except BaseException:
        ours.close()
        theirs.close()
        raise
    if pid == 0:  # the helper: system calls only, then _exit
        code = 1
        try:
            ours.close()
            _check(_c().unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
            loopback_up()
            fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
            socket.send_fds(theirs, [b"n"], [fd])
            code = 0
        except BaseException as exc:
            with contextlib.suppress(BaseException):
                theirs.sendall(f"{getattr(exc, 'errno', 0) or 1}".encode())
        finally:
            os._exit(code)
    theirs.close()
    try:
        message, fds, _, _ = socket.recv_fds(ours, 32, 1)
    finally:
        ours.close()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    if message != b"n" or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        code = int(message) if message.isdigit() else 1
        raise OSError(code, f"a network namespace cannot be made: {os.strerror(code)}")
    os.set_inheritable(fds[0], False)
    return fds[0]


def prepare_ahead(preparation: dict[str, Any] | None) -> None:
    """In an init waiting for its command: make the namespace the last confined command had
    (``preparation["netns"]``), so that this one need not. Failing costs nothing: the
    command's own attempt (:func:`join`) says why."""
    global _ahead
    if not (preparation or {}).get("netns") or _ahead >= 0:
        return
    with contextlib.suppress(OSError):
        _ahead = make()


def join(confine: dict[str, Any] | None) -> None:
    """Move this process (the init, before it confines itself and starts the command) into
    the network namespace ``confine`` asks for, and open the proxy's way out; a namespace
    made ahead and not needed is let go. OSError when it cannot be done: the command must
    not run."""
    global _ahead
    mode, fd, _ahead = wanted(confine), _ahead, -1
    if not mode:
        if fd >= 0:
            os.close(fd)
        return
    assert confine is not None
    door: socket.socket | None = None
    try:
        if mode == "proxy":
            door = _open_door(str(confine.get("proxy_door") or ""))
        if fd < 0:
            fd = make()
        _check(_c().setns(fd, CLONE_NEWNET), "setns(network)")
        if door is not None:
            _hand_over(door, int(confine.get("proxy_port") or 0))
    finally:
        if fd >= 0:
            os.close(fd)
        if door is not None:
            door.close()


def _open_door(name: str) -> socket.socket:
    """A connection to the proxy's door, made from the host's namespace (where the abstract
    name lives) before this process leaves it."""
    if not name:
        raise OSError(0, 'network = "proxy" but the command has no proxy door')
    door = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        door.connect("\0" + name)
    except BaseException:
        door.close()
        raise
    return door


def _hand_over(door: socket.socket, port: int) -> None:
    """Listen on ``127.0.0.1:port`` in this (new) namespace and pass the socket through the
    door: from then on the proxy accepts the command's connections there."""
    if not 0 < port < 65536:
        raise OSError(0, f"no port for the proxy's address ({port})")
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind(("127.0.0.1", port))
        listener.listen(128)
        socket.send_fds(door, [DOOR_MESSAGE], [listener.fileno()])
    finally:
        listener.close()  # the daemon holds it now; the init keeps nothing that listens


_available: str | None = None
_PROBE = """
import os, sys
sys.path.append(sys.argv[1])
from endpointd.guard import netns
if os.geteuid() != 0:
    uid, gid = os.geteuid(), os.getegid()
    if netns._c().unshare(netns.CLONE_NEWUSER) != 0:
        raise OSError(netns.ctypes.get_errno(), "unshare(CLONE_NEWUSER)")
    for path, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                       ("gid_map", f"{gid} {gid} 1")):
        with open("/proc/self/" + path, "w") as f:
            f.write(text)
os.close(netns.make())
"""


def unavailable_reason() -> str:
    """Why a command cannot get a network namespace here ("" when it can): tried for real,
    once, in a fresh interpreter, the way :mod:`endpointd.guard.namespaces` probes."""
    global _available
    if _available is not None:
        return _available
    if not sys.platform.startswith("linux"):
        _available = f"no network namespaces on {sys.platform}"
        return _available
    _available = namespaces.probe(_PROBE)
    return _available


def available() -> bool:
    return not unavailable_reason()
