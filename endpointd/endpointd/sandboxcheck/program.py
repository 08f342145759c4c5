"""The probe program: what runs inside the sandbox during `endpointd sandbox check`.

It is started like any command (the daemon's executor, supervisor and sandbox), as
``python -I -S -c <this file's source>``, with its plan on stdin: a JSON list of
``{"id", "action", "target", "token"}``. For each probe it prints one JSON line,
``{"id", "ok", "detail"}``, where ``ok`` means the action succeeded, i.e. the sandbox let
it through (see :mod:`endpointd.sandboxcheck.suite` for the actions). ``detail`` is an
errno name or a capability mask, never file content: the only content it reads is a
canary's, and it prints only whether the token matched.

Standard library only, no imports from endpointd: it runs in a bare interpreter, and
everything it needs comes in the plan. Every blocking step has a timeout.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import stat
import sys

TIMEOUT = 1.0  # seconds for each connect


def _errno(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, type(exc).__name__)


def _status_field(path: str, name: str) -> str:
    with open(path, encoding="ascii", errors="replace") as f:
        for line in f:
            if line.startswith(name + ":"):
                return line.split(":", 1)[1].strip()
    return ""


def probe(action: str, target: str, token: str) -> tuple[bool, str]:
    """Whether ``action`` on ``target`` succeeded, and a short detail."""
    try:
        if action == "read":
            fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            try:
                data = os.read(fd, 4096)
            finally:
                os.close(fd)
            return (token.encode() in data), "read the canary" if token.encode() in data else (
                "opened, no canary"
            )
        if action == "append":
            # Opening for writing is what the kernel checks; nothing is written. A link is
            # followed: an owner's ~/.bashrc is often one (a dotfile manager's), and a
            # command could write through it just the same.
            fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK)
            os.close(fd)
            return True, "opened for writing"
        if action == "create":
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            os.close(fd)
            os.unlink(target)
            return True, "created"
        if action in ("unix", "tcp"):
            if action == "unix":
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                # "@name": an abstract socket (no path, so no file permission guards it).
                address: object = "\0" + target[1:] if target.startswith("@") else target
            else:
                host, _, port = target.rpartition(":")
                family = socket.AF_INET6 if ":" in host else socket.AF_INET
                sock = socket.socket(family, socket.SOCK_STREAM)
                address = (host, int(port))
            try:
                sock.settimeout(TIMEOUT)
                sock.connect(address)  # type: ignore[arg-type]
            finally:
                sock.close()
            return True, "connected"
        if action == "udp":
            host, _, port = target.rpartition(":")
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
                udp.sendto(b"endpointd-sandbox-check", (host, int(port)))
            return True, "sent"
        if action == "signal":
            os.kill(int(target), 0)  # signal 0: checks that it could, delivers nothing
            return True, "reachable"
        if action == "tty":
            fd = os.open(target, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
            os.close(fd)
            return True, "opened"
        if action == "caps":
            mask = _status_field(target, "CapEff")
            held = int(mask or "0", 16) != 0
            return held, f"CapEff {mask or '?'}"
        if action == "uid":
            uids = _status_field(target, "Uid") or "?"
            return "0" in uids.split(), f"Uid {uids}"
        if action == "nnp":
            value = _status_field(target, "NoNewPrivs")
            return value != "1", f"NoNewPrivs {value or '?'}"
        if action == "mknod":
            os.mknod(target, stat.S_IFCHR | 0o600, os.makedev(1, 3))
            os.unlink(target)
            return True, "made /dev/null's twin"
    except TimeoutError:
        # Not refused by the kernel: the attempt left the sandbox.
        return True, "timed out (not refused)"
    except OSError as exc:
        return False, _errno(exc)
    except ValueError as exc:
        return False, f"bad target: {exc}"
    except Exception as exc:  # one probe's surprise must not cost the others their result
        return False, f"failed: {type(exc).__name__}"
    return False, f"unknown action {action!r}"


def main() -> None:
    plan = json.loads(sys.stdin.buffer.read() or b"[]")
    for item in plan:
        ok, detail = probe(str(item["action"]), str(item.get("target", "")), str(item["token"]))
        sys.stdout.write(json.dumps({"id": item["id"], "ok": ok, "detail": detail}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
