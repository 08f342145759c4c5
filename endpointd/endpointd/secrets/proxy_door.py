"""The per-command proxy's door: how it reaches into a command's network namespace (Linux).

Under ``network = "proxy"`` a command runs in a network namespace of its own whose only way
out is its proxy (:mod:`endpointd.guard.netns`). The namespace's init listens on the
proxy's address *inside* it and passes that listening socket (``SCM_RIGHTS``) through this
door, an abstract Unix socket with a random name; the proxy then accepts the command's
connections on it from the daemon's side (:class:`endpointd.secrets.proxy.CredentialProxy`),
and makes its own connections out from the host's namespace. Nothing relays bytes between
the two; a socket keeps the namespace it was made in, whoever holds it.

Who may come through: a process of the command's tree only. ``SO_PEERCRED`` names the
connecting pid, which the proxy checks against the command's supervisor for every
connection the listener brings (the supervisor's pid may not be known yet when the init
knocks). The door takes one listening TCP socket per connection and nothing else, a few
connections at most, from processes of the daemon's user only; a command itself cannot
reach the door (Landlock scopes abstract Unix sockets to the command's domain, and its
network namespace has no view of the host's).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
from collections.abc import Callable

from endpointd.secrets import peer

__all__ = ["DOOR_MESSAGE", "Door"]

log = logging.getLogger(__name__)

# What the init sends with the listening socket (the same byte as guard/netns.py's).
DOOR_MESSAGE = b"L"
# A command's namespace is made once (its workspace setup has a proxy of its own): a few
# listeners per proxy are plenty, and bound what a stranger could make it hold.
MAX_LISTENERS = 4


class Door:
    """One proxy's door: ``name`` (abstract, without the leading NUL) is bound at once;
    :meth:`start` serves it in the running loop, handing each listener received, with the
    pid that passed it, to ``on_listener``."""

    def __init__(self, on_listener: Callable[[socket.socket, int], None]) -> None:
        self.name = "endpointd-proxy-" + os.urandom(16).hex()
        self._on_listener = on_listener
        self._sock: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.bind("\0" + self.name)
            self._sock.listen(MAX_LISTENERS)
            self._sock.setblocking(False)
        except BaseException:
            self._sock.close()
            raise
        self._pending: set[socket.socket] = set()
        self._received = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        if self._sock is None or self._loop is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._sock.fileno(), self._knock)

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is None:
            return
        if self._loop is not None:
            self._loop.remove_reader(sock.fileno())
            for conn in self._pending:
                self._loop.remove_reader(conn.fileno())
        for conn in self._pending:
            conn.close()
        self._pending.clear()
        sock.close()

    def _knock(self) -> None:
        assert self._sock is not None
        assert self._loop is not None
        try:
            conn, _ = self._sock.accept()
        except OSError:
            return  # (BlockingIOError: another wake-up took it)
        # An abstract name has no permissions, and its name shows in /proc/net/unix: another
        # user's process must not even hold one of the few places.
        if not _same_user(conn) or self._received + len(self._pending) >= MAX_LISTENERS:
            conn.close()
            return
        conn.setblocking(False)
        self._pending.add(conn)
        self._loop.add_reader(conn.fileno(), self._receive, conn)

    def _receive(self, conn: socket.socket) -> None:
        assert self._loop is not None
        try:
            message, fds, _, _ = socket.recv_fds(conn, 16, 1)
        except BlockingIOError:
            return  # woken early: the reader stays
        except OSError:
            message, fds = b"", []
        self._loop.remove_reader(conn.fileno())
        self._pending.discard(conn)
        sender = peer.unix_peer_pid(conn)
        conn.close()
        listeners = [socket.socket(fileno=fd) for fd in fds]
        if message != DOOR_MESSAGE or len(listeners) != 1 or sender is None:
            for listener in listeners:
                listener.close()
            log.warning("proxy door: turned away a malformed hand-over")
            return
        listener = listeners[0]
        if not _is_tcp_listener(listener):
            listener.close()
            log.warning("proxy door: turned away a socket that is not a TCP listener")
            return
        self._received += 1
        listener.setblocking(False)
        self._on_listener(listener, sender)


_PEERCRED = struct.Struct("3i")


def _same_user(conn: socket.socket) -> bool:
    """Whether the process at the other end runs as the daemon's user (SO_PEERCRED)."""
    try:
        _, uid, _ = _PEERCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    except (OSError, AttributeError):
        return False
    return bool(uid == os.geteuid())


def _is_tcp_listener(sock: socket.socket) -> bool:
    with contextlib.suppress(OSError):
        return (
            sock.family in (socket.AF_INET, socket.AF_INET6)
            and sock.type == socket.SOCK_STREAM
            and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
        )
    return False
