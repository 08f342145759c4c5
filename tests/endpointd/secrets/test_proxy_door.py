"""The proxy's door (endpointd/secrets/proxy_door.py) against who may knock: a listening
socket is taken from a process of the daemon's user only, and nothing but a listener."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys

import pytest

import endpointd
from endpointd.secrets.proxy_door import Door

ENDPOINTD_DIR = os.path.dirname(os.path.dirname(os.path.abspath(endpointd.__file__)))

# Knocks at the door as uid argv[2] (or as itself with -1) and passes argv[3]'s kind of
# socket; prints what came back (the door closes the connection either way, at once or
# after reading, so a reset is an answer too).
KNOCK = """
import os, socket, sys
name, uid, kind = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if kind == "listener":
    passed = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    passed.bind(("127.0.0.1", 0))
    passed.listen()
else:
    passed = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
if uid >= 0:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
door = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
door.connect("\\0" + name)
try:
    socket.send_fds(door, [b"L"], [passed.fileno()])
except OSError as exc:
    print("send failed", exc.errno)
door.settimeout(10)
try:
    print("answer", door.recv(1))
except ConnectionResetError:
    # The door closed without reading what was sent (how it turns away a stranger):
    # the kernel answers the unread bytes with a reset.
    print("answer reset")
"""


async def _knock(uid: int, kind: str) -> tuple[list[tuple[int, int]], str]:
    received: list[tuple[int, int]] = []

    def on_listener(listener: socket.socket, sender: int) -> None:
        received.append((listener.fileno(), sender))
        listener.close()

    door = Door(on_listener)
    door.start()
    try:
        knocker = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            "-S",
            "-c",
            KNOCK,
            door.name,
            str(uid),
            kind,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(knocker.communicate(), 30)
        assert knocker.returncode == 0, err
        return received, out.decode()
    finally:
        door.close()


async def test_a_listener_from_the_daemons_user_is_taken_with_its_pid() -> None:
    received, said = await _knock(-1, "listener")
    assert len(received) == 1, said
    assert received[0][1] > 0


async def test_anything_but_a_listening_tcp_socket_is_turned_away() -> None:
    received, said = await _knock(-1, "datagram")
    assert received == [], said


@pytest.mark.skipif(os.geteuid() != 0, reason="knocks as another user")
async def test_another_users_process_is_turned_away_at_once() -> None:
    received, said = await _knock(65534, "listener")
    assert received == [], said
