"""git's credential helper for commands run by endpointd (DELIVERY_GIT_HELPER).

git runs it as configured by :mod:`endpointd.secrets.delivery`::

    python -I -S .../endpointd/secrets/git_helper.py SOCKET ACTION

with the credential request on stdin (``key=value`` lines). For ``get`` it passes the
request to the endpointd daemon over the command's private unix socket ``SOCKET`` and prints
the answer (``username=…``, ``password=…``) for git. The daemon decides from git's
``protocol=`` and ``host=`` lines: it answers only ``https`` requests for the hosts the local
policy names for the credential (``[credentials.NAME] hosts``), and only to processes of the
command; anything else gets an empty answer, this prints nothing, and git fails to
authenticate. ``store`` and ``erase`` are ignored: endpointd's credential store (the keyring, or its
0600 files on a machine without one) is the only place credentials live.

Run as a file, not imported: standard library only, no ``sys.path`` games, so that it starts
fast and that nothing in the command's environment (``-I``: no ``PYTHON*`` variables; ``-S``:
no site-packages) can change what runs here. It never prints the password anywhere but to
git, and its errors name the socket only.
"""

from __future__ import annotations

import os
import socket
import sys

MAX_REQUEST = 64 * 1024
MAX_ANSWER = 64 * 1024
TIMEOUT_SECONDS = 10.0


def _say(message: str) -> None:
    print(f"endpointd git credential helper: {message}", file=sys.stderr)


def _ask(path: str, request: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(TIMEOUT_SECONDS)
        sock.connect(path)
        sock.sendall(b"get\n" + request)
        sock.shutdown(socket.SHUT_WR)
        answer = bytearray()
        while len(answer) <= MAX_ANSWER:
            data = sock.recv(4096)
            if not data:
                return bytes(answer)
            answer += data
    raise ValueError("answer too large")


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        _say("usage: git_helper.py SOCKET get|store|erase (git runs this, not you)")
        return 2
    path, action = argv[1], argv[2]
    # git writes the whole request and closes the pipe; read it even when it is not used,
    # so that git never sees a broken pipe.
    request = sys.stdin.buffer.read(MAX_REQUEST)
    if action != "get":
        return 0
    try:
        answer = _ask(path, request)
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        _say(f"no credential from endpointd ({reason}); it serves one only while its command runs")
        return 1
    if not answer:
        _say(
            "endpointd gave no credential (it answers only https requests for the hosts the"
            " local policy names for this credential)"
        )
        return 1
    out = sys.stdout.buffer
    out.write(answer)
    out.flush()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        # git went away; keep Python from complaining on the way out.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
