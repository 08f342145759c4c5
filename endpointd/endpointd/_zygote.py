"""The zygote: a pre-imported process that forks exec supervisors on the daemon's behalf.

Starting a supervisor as a fresh ``python -I -S`` costs an interpreter start-up (tens of
milliseconds) per command. The daemon therefore keeps one zygote running - the same bare
interpreter, started the same way (``python -I -S -c <bootstrap> PACKAGE_ROOT --zygote FD``,
in a new session), with :mod:`endpointd._supervise` already imported - and asks it, over the
unix socket ``FD`` (one end of a socketpair the daemon keeps), to fork one supervisor per
command. The zygote lives exactly as long as that socket: when the daemon exits or dies, it
reads EOF and exits too; a restarted daemon starts its own.

Per request (``{"spool": DIR, "spec": {...}}``, the same spec the fresh supervisor reads on
stdin) the zygote forks; the child calls ``setsid()`` (a session of its own, like
``start_new_session``) and forks again, the grandchild becomes the supervisor and the child
exits at once, so the supervisor is reparented away from the zygote (to init or the nearest
subreaper): killing the zygote, or the daemon, never touches it. The child reports the
grandchild's pid on a pipe; the zygote reaps the child and replies ``{"pid": N}`` (or
``{"error": "..."}``). The grandchild resets what a fork inherits and an exec would not:
signal handlers, the signal mask and the wakeup fd; every fd but 0/1/2, which become
``/dev/null``, ``/dev/null`` and the spool's ``supervisor.log``; the working directory (the
spool). The zygote is single-threaded, so forking it is safe.

Exactly once: the forked supervisor *claims* the spool before anything else by creating
``supervisor.pid`` with its pid, without clobbering (``link``). If the daemon gave up on the
zygote mid-request (it died or did not answer), the daemon claims the file first (an empty
one) and falls back to a fresh supervisor; a late forked supervisor then finds the claim
taken and exits without running anything. If the daemon finds the claim already taken, the
forked supervisor runs the command and the daemon adopts it by the pid in the file.

Wire format: each message is a 4-byte big-endian length, then that many bytes of JSON. The
zygote sends a single ``R`` once it is ready, before any message.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import sys
import traceback

from endpointd import _supervise
from endpointd.fsutil import _create_temp
from endpointd.spoolformat import SUPERVISOR_LOG, SUPERVISOR_PID_FILE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

READY = b"R"
LENGTH = struct.Struct(">I")
MAX_MESSAGE = 64 * 1024 * 1024


def encode(message: dict[str, Any]) -> bytes:
    body = json.dumps(message).encode("utf-8")
    return LENGTH.pack(len(body)) + body


def _recv_exactly(sock: socket.socket, size: int) -> bytes | None:
    chunks = []
    while size:
        data = sock.recv(min(size, 1 << 20))
        if not data:
            return None
        chunks.append(data)
        size -= len(data)
    return b"".join(chunks)


def _recv_message(sock: socket.socket) -> dict[str, Any] | None:
    header = _recv_exactly(sock, LENGTH.size)
    if header is None:
        return None
    (size,) = LENGTH.unpack(header)
    if size > MAX_MESSAGE:
        raise ValueError(f"message of {size} bytes")
    body = _recv_exactly(sock, size)
    if body is None:
        return None
    message: dict[str, Any] = json.loads(body)
    return message


def claim(directory: str) -> bool:
    """Create ``supervisor.pid`` holding our pid, unless it exists (see the module doc)."""
    fd, tmp = _create_temp(directory, SUPERVISOR_PID_FILE)
    try:
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        try:
            os.link(tmp, os.path.join(directory, SUPERVISOR_PID_FILE))
        except FileExistsError:
            return False
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _reset_signals() -> None:
    """What a fresh interpreter would have: defaults, SIGINT -> KeyboardInterrupt, no mask."""
    with contextlib.suppress(ValueError, OSError):
        signal.set_wakeup_fd(-1)
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # As _supervise.run does: never die of SIGPIPE on the diagnostics log.
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


def _redirect_fds(directory: str) -> None:
    devnull = os.open(os.devnull, os.O_RDWR)
    log = os.open(
        os.path.join(directory, SUPERVISOR_LOG), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600
    )
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.dup2(log, 2)
    try:
        max_fd = os.sysconf("SC_OPEN_MAX")
    except (OSError, ValueError):
        max_fd = 65536
    os.closerange(3, max(max_fd, 256))


def _become_supervisor(directory: str, spec: dict[str, Any], sock: socket.socket) -> None:
    """In the grandchild: turn into a supervisor for ``spec``; never returns."""
    code = 0
    try:
        sock.close()
        _reset_signals()
        _redirect_fds(directory)
        os.chdir(directory)
        if not claim(directory):
            print("endpointd: the daemon gave up on this launch; not running", file=sys.stderr)
            return
        _supervise.run_spec(directory, spec)
    except BaseException:
        code = 1
        with contextlib.suppress(BaseException):
            traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            sys.stderr.flush()
        os._exit(code)


def launch(directory: str, spec: dict[str, Any], sock: socket.socket) -> int:
    """Fork a supervisor for ``spec`` in ``directory``; returns its pid (not our child)."""
    read_end, write_end = os.pipe()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    try:
        child = os.fork()
    except BaseException:
        os.close(read_end)
        os.close(write_end)
        raise
    if child == 0:
        try:
            os.close(read_end)
            os.setsid()
            grandchild = os.fork()
            if grandchild == 0:
                os.close(write_end)
                _become_supervisor(directory, spec, sock)
            os.write(write_end, str(grandchild).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        data = b""
        while chunk := os.read(read_end, 64):
            data += chunk
    finally:
        os.close(read_end)
        os.waitpid(child, 0)
    if not data:
        raise OSError("the intermediate child could not fork the supervisor")
    return int(data)


def serve(fd: int) -> None:
    """The zygote's loop: one request at a time until the daemon closes the socket."""
    sock = socket.socket(fileno=fd)
    sock.setblocking(True)
    # Warm up what the supervisor would otherwise import per command.
    with contextlib.suppress(Exception):
        import ctypes  # noqa: F401
    sock.sendall(READY)
    while True:
        try:
            request = _recv_message(sock)
        except (OSError, ValueError):
            return
        if request is None:
            return  # the daemon is gone
        try:
            reply: dict[str, Any] = {
                "pid": launch(os.path.abspath(request["spool"]), request["spec"], sock)
            }
        except Exception as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        try:
            sock.sendall(encode(reply))
        except OSError:
            return
