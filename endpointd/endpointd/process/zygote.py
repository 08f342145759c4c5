"""The zygote: a pre-imported process that forks exec supervisors on the daemon's behalf.

Starting a supervisor as a fresh ``python -I -S`` costs an interpreter start-up (tens of
milliseconds) per command. The daemon therefore keeps one zygote running - the same bare
interpreter, started the same way (``python -I -S -c <bootstrap> PACKAGE_ROOT --zygote FD``,
in a new session), with :mod:`endpointd.process.supervisor` already imported - and asks it, over the
unix socket ``FD`` (one end of a socketpair the daemon keeps), to fork one supervisor per
command. The zygote lives exactly as long as that socket: when the daemon exits or dies, it
reads EOF and exits too; a restarted daemon starts its own.

Forking is not cheap either (about half a millisecond per fork of even this small process on
a VM), and neither is a request/reply round trip between two processes that must each be
woken up. So the zygote forks *spares* ahead of time and hands them to the daemon: a spare
has already called ``setsid()`` (a session of its own, like ``start_new_session``), reset
what a fork inherits and an exec would not (signal handlers, the signal mask, the wakeup
fd), pointed fds 0 and 1 at ``/dev/null`` and closed every other fd but its own end of a
socketpair, on which it blocks. The zygote passes the other end to the daemon with the
spare's pid (``SCM_RIGHTS``). To start a command the daemon writes the request
(``{"spool": DIR, "spec": {...}}``, the same spec the fresh supervisor reads on stdin)
straight to a spare it holds and asks the zygote for a replacement; no fork and no round
trip is on a command's path. The spare, now the supervisor, points fd 2 at the spool's
``supervisor.log`` and moves into the spool. A spare whose socket reaches EOF (the daemon
closed it, or died) exits without running anything.

Supervisors are the zygote's children: it ignores ``SIGCHLD`` so the kernel reaps them, it
never signals them, and when it exits they are reparented (to init or the nearest
subreaper) and run on; killing the zygote or the daemon never touches a running supervisor.
The zygote is single-threaded, so forking it is safe.

Exactly once: the forked supervisor *claims* the spool before anything else by creating
``supervisor.pid`` with its pid, without clobbering (``link``). If handing a request to a
spare failed part-way, the daemon claims the file first (an empty one) and falls back to a
fresh supervisor; a spare that got the request after all then finds the claim taken and
exits without running anything. If the daemon finds the claim already taken, the forked
supervisor runs the command and the daemon adopts it by the pid in the file. (A spare that
reads a truncated request sees EOF and runs nothing.)

Wire format. Zygote to daemon: a single ``R`` once it is ready, then per spare a 4-byte
big-endian pid carrying the daemon's end of the spare's socketpair (``SCM_RIGHTS``); pid 0
without a socket means a fork failed. Daemon to zygote: one byte per spare wanted, ``F``, or
``P`` for a spare that prepares the namespace of a confined command while it waits
(:mod:`endpointd.process.nsinit`); or ``S``, a 4-byte big-endian length and that much JSON:
what those spares apply ahead from then on (the hidden sockets and read grants the last
confined command had).
Daemon to spare: a 4-byte big-endian length, then that many bytes of JSON; for a request
with ``"gated": true``, later one byte ``G`` once the daemon's journal holds the command
durably. A gated spare does everything up to starting the command, then waits for that
byte; EOF instead means the command was withdrawn, and it exits without running it or
writing a status.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import socket
import struct
import sys
import traceback

from endpointd import commanduser
from endpointd.fsutil import _create_temp
from endpointd.process import supervisor as _supervise
from endpointd.spoolformat import SUPERVISOR_LOG, SUPERVISOR_PID_FILE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

READY = b"R"
FORK = b"F"
FORK_PREPARED = b"P"  # a spare that prepares a confined command's namespace while it waits
TEACH = b"S"  # then a length-prefixed JSON: what prepared spares apply ahead from now on
GO = b"G"  # daemon to a gated spare: the command is journaled durably, start it
LENGTH = struct.Struct(">I")
PID = struct.Struct(">I")
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


def _recv_frame(sock: socket.socket) -> bytes | None:
    """One message's JSON body, undecoded; None on EOF."""
    header = _recv_exactly(sock, LENGTH.size)
    if header is None:
        return None
    (size,) = LENGTH.unpack(header)
    if size > MAX_MESSAGE:
        raise ValueError(f"message of {size} bytes")
    return _recv_exactly(sock, size)


def _recv_message(sock: socket.socket) -> dict[str, Any] | None:
    body = _recv_frame(sock)
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
    """What a fresh interpreter would have: defaults, SIGINT -> KeyboardInterrupt, no mask.

    Only what Python itself installed differs from the defaults in the zygote (a bare
    interpreter that sets no handlers from C), so only those are reset: one ``sigaction``
    per changed signal instead of one per signal.
    """
    with contextlib.suppress(ValueError, OSError):
        signal.set_wakeup_fd(-1)
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            if signal.getsignal(sig) not in (signal.SIG_DFL, None):
                signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # As _supervise.run does: never die of SIGPIPE on the diagnostics log.
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


def _detach_fds(keep: int) -> None:
    """Point fds 0 and 1 at /dev/null and close every other fd but ``keep``, 2 and the id
    map a root daemon's commands are mounted with (:mod:`endpointd.commanduser`)."""
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    try:
        max_fd = os.sysconf("SC_OPEN_MAX")
    except (OSError, ValueError):
        max_fd = 65536
    low = 3
    for fd in sorted({keep, *commanduser.held()}):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, max(max_fd, 256))


def _redirect_stderr(directory: str) -> None:
    """Send fd 2 to the spool's ``supervisor.log``."""
    log = os.open(
        os.path.join(directory, SUPERVISOR_LOG), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600
    )
    os.dup2(log, 2)
    os.close(log)


def _become_supervisor(
    directory: str,
    spec: dict[str, Any],
    channel: socket.socket,
    gate: Callable[[], bool] | None = None,
) -> None:
    """In the spare: turn into a supervisor for ``spec``; never returns.

    ``channel`` stays open until the outcome is recorded and is closed before anything
    else: the daemon learns of the end from its EOF, without waiting for this process's exit
    (tearing down a process takes a good part of a millisecond). Nothing the command starts
    inherits it (it is close-on-exec, and the command's fds are closed anyway).
    """
    code = 0
    try:
        _redirect_stderr(directory)
        os.chdir(directory)
        if not claim(directory):
            print("endpointd: the daemon gave up on this launch; not running", file=sys.stderr)
            return
        _supervise.run_spec(directory, spec, gate)
    except BaseException:
        code = 1
        with contextlib.suppress(BaseException):
            traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            channel.close()
        with contextlib.suppress(BaseException):
            sys.stderr.flush()
        os._exit(code)


def _spare_main(
    channel: socket.socket, daemon: socket.socket, prepare: bool, taught: dict[str, Any] | None
) -> None:
    """In a freshly forked spare: get ready, wait for a request, become its supervisor."""
    code = 0
    try:
        daemon.close()  # the daemon's socket is the zygote's alone
        os.setsid()
        _reset_signals()
        _detach_fds(keep=channel.fileno())
        _supervise.become_subreaper()  # whatever the request, before it arrives
        if prepare:
            _supervise.prepare_init(taught)
        request = _recv_message(channel)
        if request is not None:
            gate = (lambda: channel.recv(1) == GO) if request.get("gated") else None
            _become_supervisor(os.path.abspath(request["spool"]), request["spec"], channel, gate)
    except BaseException:
        code = 1
        with contextlib.suppress(BaseException):
            traceback.print_exc()  # still the daemon's stderr: no spool was named yet
            sys.stderr.flush()
    finally:
        os._exit(code)


def _fork_spare(
    daemon: socket.socket, prepare: bool, taught: dict[str, Any] | None
) -> tuple[int, socket.socket]:
    """Fork a spare; its pid and our end of its socketpair."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    try:
        pid = os.fork()
    except BaseException:
        ours.close()
        theirs.close()
        raise
    if pid == 0:
        ours.close()
        _spare_main(theirs, daemon, prepare, taught)
    theirs.close()
    return pid, ours


def serve(fd: int) -> None:
    """The zygote's loop: fork spares for the daemon until it closes the socket."""
    sock = socket.socket(fileno=fd)
    sock.setblocking(True)
    # Supervisors are our children; the kernel reaps them (see the module doc).
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    # Warm up what the supervisor would otherwise load per command.
    with contextlib.suppress(Exception):
        _supervise.load_libc()
        _supervise.load_sandbox()
    # Every object so far (the imports) moves out of the collector's sight: a collection in
    # a forked spare or init would otherwise write to each one's header, copying the pages
    # they sit on (copy-on-write). With the loads above, a confined command's processes
    # fault in 15% fewer pages (bench/RESULTS.md).
    gc.collect()
    gc.freeze()
    sock.sendall(READY)
    taught: dict[str, Any] | None = None
    pending = b""
    while True:
        try:
            received = sock.recv(64 * 1024)
        except OSError:
            return
        if not received:
            return  # the daemon is gone
        pending += received
        while pending:
            byte, rest = pending[:1], pending[1:]
            if byte == TEACH:
                if len(rest) < LENGTH.size:
                    break
                (size,) = LENGTH.unpack(rest[: LENGTH.size])
                if len(rest) < LENGTH.size + size:
                    break
                with contextlib.suppress(ValueError):
                    taught = json.loads(rest[LENGTH.size : LENGTH.size + size])
                pending = rest[LENGTH.size + size :]
                continue
            pending = rest
            if byte not in (FORK, FORK_PREPARED):
                continue
            try:
                pid, channel = _fork_spare(sock, byte == FORK_PREPARED, taught)
            except OSError as exc:
                print(f"endpointd zygote: cannot fork: {exc}", file=sys.stderr)
                try:
                    sock.sendall(PID.pack(0))
                except OSError:
                    return
                continue
            try:
                socket.send_fds(sock, [PID.pack(pid)], [channel.fileno()])
            except OSError:
                return
            finally:
                channel.close()
