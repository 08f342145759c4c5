"""Is the process at the other end of a local connection one of a command's processes?

The credential proxy and the git credential helper serve one command each. A token (the
proxy) or a 0600 socket (the helper) already keeps other users out; this module keeps out
the user's *other* processes too, on Linux, by asking the kernel who is connecting:

* a unix socket: ``SO_PEERCRED`` names the connecting pid;
* a TCP connection on loopback: the client's source port is looked up in ``/proc/net/tcp``
  and ``/proc/net/tcp6`` (whose rows name each socket's inode), and the pids holding that
  inode are found among the command's processes through ``/proc/PID/fd``.

A pid belongs to the command when its parent chain (``/proc/PID/stat``) reaches the
command's supervisor (the root of its process tree). A process that left the tree on
purpose (double fork, reparented to init) is not the command's any more, and is refused.

Where ``/proc`` is not there (macOS, a hardened mount) :func:`proc_available` is False and
callers fall back to what they check otherwise (the token, the socket's permissions).
Everything here reads files only; nothing raises for a process that vanished meanwhile.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from collections.abc import Iterable
from pathlib import Path

__all__ = [
    "descends_from",
    "proc_available",
    "tcp_peer_in_tree",
    "tree",
    "unix_peer_pid",
]

PROC = Path("/proc")
# Deeper than any real process tree; a cycle (pid reuse mid-walk) cannot loop forever.
_MAX_DEPTH = 4096
_PEERCRED = struct.Struct("3i")


def proc_available() -> bool:
    """Whether ``/proc`` answers the questions this module asks (Linux, mounted)."""
    return (PROC / "self" / "stat").exists() and (PROC / "net" / "tcp").exists()


def parent_of(pid: int) -> int | None:
    """The parent pid of ``pid``, or None when it is gone."""
    try:
        data = (PROC / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses; the last ')' ends it.
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        return int(fields[1])
    except (IndexError, ValueError):
        return None


def descends_from(pid: int, root: int) -> bool:
    """Whether ``pid`` is ``root`` or one of its descendants (by the live parent chain)."""
    current: int | None = pid
    for _ in range(_MAX_DEPTH):
        if current is None or current <= 0:
            return False
        if current == root:
            return True
        if current == 1:
            return False
        current = parent_of(current)
    return False


def tree(root: int) -> set[int]:
    """``root`` and every live process descending from it (one pass over ``/proc``)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir(PROC)
    except OSError:
        return {root}
    for name in entries:
        if not name.isdigit():
            continue
        pid = int(name)
        parent = parent_of(pid)
        if parent is not None:
            children.setdefault(parent, []).append(pid)
    found = {root}
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def _decode_address(text: str) -> tuple[str, int] | None:
    """``0100007F:1F90`` (/proc/net/tcp{,6}: 32-bit words in host order) -> (ip, port)."""
    address, _, port = text.partition(":")
    try:
        words = [int(address[i : i + 8], 16) for i in range(0, len(address), 8)]
        raw = b"".join(struct.pack("=I", word) for word in words)
        ip = ipaddress.ip_address(raw)
        return str(ip), int(port, 16)
    except ValueError:
        return None


def _same_ip(a: str, b: str) -> bool:
    try:
        left, right = ipaddress.ip_address(a), ipaddress.ip_address(b)
    except ValueError:
        return False
    if isinstance(left, ipaddress.IPv6Address) and left.ipv4_mapped is not None:
        left = left.ipv4_mapped
    if isinstance(right, ipaddress.IPv6Address) and right.ipv4_mapped is not None:
        right = right.ipv4_mapped
    return left == right


def socket_inodes(local: tuple[str, int], remote: tuple[str, int]) -> set[int]:
    """Inodes of the TCP sockets whose local end is ``local`` and remote end ``remote``
    (as the connecting process sees them: its source address, then the server's)."""
    found: set[int] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10:
                continue
            here, there = _decode_address(fields[1]), _decode_address(fields[2])
            if here is None or there is None:
                continue
            if here[1] != local[1] or there[1] != remote[1]:
                continue
            if _same_ip(here[0], local[0]) and _same_ip(there[0], remote[0]):
                try:
                    inode = int(fields[9])
                except ValueError:
                    continue
                if inode:
                    found.add(inode)
    return found


def holders(inodes: set[int], pids: Iterable[int]) -> set[int]:
    """Which of ``pids`` hold an open fd on one of the socket ``inodes``."""
    wanted = {f"socket:[{inode}]" for inode in inodes}
    found: set[int] = set()
    for pid in pids:
        directory = PROC / str(pid) / "fd"
        try:
            fds = os.listdir(directory)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(directory / fd) in wanted:
                    found.add(pid)
                    break
            except OSError:
                continue
    return found


def tcp_peer_in_tree(peer: tuple[str, int], server: tuple[str, int], root: int) -> bool:
    """Whether the loopback TCP client at ``peer``, connected to ``server``, is a process of
    ``root``'s tree. False when it cannot be told (the connection is gone, no ``/proc``):
    callers that want a fallback check :func:`proc_available` first.

    Blocking (it reads ``/proc``): run it in a thread from asyncio.
    """
    inodes = socket_inodes(peer, server)
    if not inodes:
        return False
    return bool(holders(inodes, tree(root)))


def unix_peer_pid(sock: socket.socket) -> int | None:
    """The pid of the process at the other end of a unix socket (Linux), else None."""
    so_peercred = getattr(socket, "SO_PEERCRED", None)
    if so_peercred is None:
        return None
    try:
        pid, _, _ = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, so_peercred, 12))
    except OSError:
        return None
    return int(pid) if pid > 0 else None
