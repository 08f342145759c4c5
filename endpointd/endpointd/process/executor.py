"""Starting exec commands under their supervisor, cancelling them, and checking on them.

The daemon never runs a command as its own child: it has the supervisor
(``endpointd.process.supervisor``) forked by its zygote (``endpointd.process.zygote``), or
starts it as a fresh interpreter when no zygote is available, in a new session either way, and
hands it the spec (see those modules for why). Everything here is about that hand-off and about the
supervisor's pid, which is all a daemon - this one or a restarted one - needs to cancel a
command or to notice that its supervisor died without recording an outcome.

A "shell string" needs nothing special: the control plane sends ``argv = ["sh", "-c",
"..."]`` and the shell is just the program that runs.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from endpointd.fsutil import atomic_write
from endpointd.guard import sandbox
from endpointd.guard.confinement import Confinement
from endpointd.process import zygote as _zygote
from endpointd.rules import environment
from endpointd.secrets.delivery import Prepared
from endpointd.spool import (
    CANCEL_FILE,
    STDIN_FILE,
    SUPERVISOR_LOG,
    SUPERVISOR_PID_FILE,
    TMP_DIR,
    read_pid,
)
from superagent_shared.messages import Exec

log = logging.getLogger(__name__)

DEFAULT_CANCEL_GRACE_SECONDS = 10
# How long a launch waits for the zygote to hand over a spare before starting the command
# without it.
SPARE_TIMEOUT = 5.0

# The directory holding the `endpointd` package (site-packages for a wheel, the source tree
# for an editable install): the only entry the supervisor adds to the bare interpreter's
# sys.path. Appended, so it can never shadow a standard-library module.
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# -I: no PYTHON* variables, no user site, no script/cwd directory on sys.path; -S: no
# site-packages and no .pth processing. Together they halve the supervisor's start-up cost,
# which every command pays. argv[1] (the package root) is popped before the supervisor runs,
# so it sees the same argv as `python -m endpointd.process.supervisor SPOOL_DIR`.
_BOOTSTRAP = (
    "import sys; sys.path.append(sys.argv.pop(1)); "
    "import endpointd.process.supervisor as s; s.run()"
)


def supervisor_argv(spool: Path) -> list[str]:
    """How the daemon starts a supervisor: a bare interpreter that imports only endpointd."""
    return [sys.executable, "-I", "-S", "-c", _BOOTSTRAP, _PACKAGE_ROOT, str(spool)]


def zygote_argv(fd: int) -> list[str]:
    """How the daemon starts its zygote: the same bare interpreter, serving on socket ``fd``."""
    return [sys.executable, "-I", "-S", "-c", _BOOTSTRAP, _PACKAGE_ROOT, "--zygote", str(fd)]


# The supervisor's and the zygote's own environment: empty. They need none (the command's
# comes in the spec), and a confined command can read its parent's /proc/PID/environ, so
# nothing of the daemon's (a login shell's AWS_SECRET_ACCESS_KEY…) may be in theirs.
SUPERVISOR_ENV: dict[str, str] = {}


@dataclass(frozen=True)
class ExecLimits:
    # The cap for every command and the value used when timeout_seconds is 0.
    max_timeout_seconds: int = 3600
    kill_grace_seconds: int = DEFAULT_CANCEL_GRACE_SECONDS


def child_environment(
    extra: Mapping[str, str], *, passed: Sequence[str] = (), tmpdir: Path | None = None
) -> dict[str, str]:
    """The command's environment: the minimal base from the daemon's own
    (:mod:`endpointd.rules.environment`), the owner's ``[env] pass``, the command's
    variables (judged by the policy already) and its private TMPDIR."""
    env = environment.minimal(os.environ, passed, extra)
    if tmpdir is not None:
        env["TMPDIR"] = str(tmpdir)
    return env


def private_tmpdir(spool: Path) -> Path:
    """The command's own TMPDIR, inside its spool (so inside endpointd's state dir, which
    every other command is denied): 0700; it goes with the spool."""
    path = spool / TMP_DIR
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def exec_spec(
    spool: Path,
    ex: Exec,
    *,
    limits: ExecLimits,
    default_cwd: Path,
    delivery: Prepared | None = None,
    confinement: Confinement | None = None,
    passed_env: Sequence[str] = (),
) -> dict[str, Any]:
    """Prepare ``spool`` (and its stdin file) for ``ex``; returns the supervisor's spec.

    ``delivery``: the command's brokered credentials (:func:`endpointd.secrets.delivery.prepare`).
    Their values end up in the spec's ``env``, which is why the spec only ever travels in
    memory (a pipe or the zygote's socket); ``remove_after`` lists the files the supervisor
    deletes once the command has ended. ``confinement``: the sandbox it runs in
    (:func:`endpointd.guard.sandbox.plan`); None runs it unconfined.
    """
    spool.mkdir(parents=True, exist_ok=True, mode=0o700)
    timeout = ex.timeout_seconds or limits.max_timeout_seconds
    env = child_environment(dict(ex.env), passed=passed_env, tmpdir=private_tmpdir(spool))
    argv = list(ex.argv)
    spec: dict[str, Any] = {
        "argv": argv,
        "cwd": ex.cwd or str(default_cwd),
        "env": delivery.apply(env) if delivery is not None else env,
        "timeout_seconds": min(timeout, limits.max_timeout_seconds),
        "kill_grace_seconds": limits.kill_grace_seconds,
        "stdin": ex.stdin is not None,
    }
    if confinement is not None and confinement.mechanism == "landlock":
        spec["landlock"] = sandbox.landlock_spec(confinement)
        if delivery is not None and delivery.proxy is not None:
            # Where the init hands the proxy its listener inside the network namespace.
            spec["landlock"]["proxy_door"] = delivery.proxy.door
    elif confinement is not None and confinement.mechanism == "seatbelt":
        from endpointd.guard import seatbelt

        spec["argv"] = seatbelt.argv(confinement, argv)
    if confinement is not None and confinement.unenforced:
        spec["unenforced"] = list(confinement.unenforced)
    if delivery is not None and delivery.remove_after:
        spec["remove_after"] = list(delivery.remove_after)
    if ex.stdin is not None:
        atomic_write(spool / STDIN_FILE, ex.stdin, mode=0o600, fsync=False)
    return spec


def start_supervisor(spool: Path, spec: Mapping[str, Any]) -> subprocess.Popen[bytes]:
    """Start a fresh supervisor interpreter for ``spec``; returns at once (it runs detached)."""
    log_fd = os.open(spool / SUPERVISOR_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        proc = subprocess.Popen(
            supervisor_argv(spool),
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=log_fd,
            cwd=spool,
            # A new session: the supervisor and the command are out of the daemon's process
            # group and terminal, so killing or stopping the daemon does not reach them.
            start_new_session=True,
            close_fds=True,
            env=SUPERVISOR_ENV,
        )
    finally:
        os.close(log_fd)
    assert proc.stdin is not None
    try:
        proc.stdin.write(json.dumps(spec).encode("utf-8"))
        proc.stdin.close()
    except BrokenPipeError:
        pass  # the supervisor died at once; the monitor reports what it recorded
    return proc


def start_exec(
    spool: Path,
    ex: Exec,
    *,
    limits: ExecLimits,
    default_cwd: Path,
    delivery: Prepared | None = None,
) -> subprocess.Popen[bytes]:
    """Start the supervisor for ``ex`` as a fresh interpreter (no zygote)."""
    spec = exec_spec(spool, ex, limits=limits, default_cwd=default_cwd, delivery=delivery)
    return start_supervisor(spool, spec)


def revoke_or_adopt(spool: Path) -> int | None:
    """After a failed zygote request: stop a late forked supervisor, or find the one that won.

    Returns None if no forked supervisor can run this command any more (the caller starts a
    fresh one), else the pid of the forked supervisor that already claimed it (see
    :mod:`endpointd.process.zygote`).
    """
    path = spool / SUPERVISOR_PID_FILE
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        return read_pid(path)
    return None


class ZygoteError(Exception):
    """No spare could be had, or the request did not reach one; it may or may not run."""


# Spares the daemon keeps in hand: one per command started back to back, a second so that a
# burst does not wait for the zygote's next fork.
SPARES = 2
# While another spare is in hand, a replacement is forked once a command ends (see
# Zygote.replenish), or at the latest this long after the launch (seconds): a spare, above
# all one that prepares a namespace, costs milliseconds of CPU, which a command starting at
# the same moment would wait for on a small machine.
REPLENISH_LATEST = 0.25


class Zygote:
    """The daemon's handle on its zygote and the spares it forked (:mod:`endpointd.process.zygote`).

    asyncio only. ``launch`` is used only once the zygote has reported ready; until then,
    and whenever it is gone, the caller starts supervisors the old way and calls
    ``ensure_started`` so the next command finds a zygote again.
    """

    def __init__(
        self,
        *,
        spare_timeout: float = SPARE_TIMEOUT,
        spares: int = SPARES,
        prepare_namespaces: bool | None = None,
    ) -> None:
        self.spare_timeout = spare_timeout
        self.wanted = spares
        # Whether spares make a confined command's PID namespace while they wait (see
        # endpointd.process.nsinit); by default, wherever the sandbox has private /proc. The
        # daemon turns it off while its policy says sandbox = "off".
        self.prepare_namespaces = prepare_namespaces
        self._taught: dict[str, Any] | None = None  # what the zygote was last taught
        self.proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._ready = False
        # Spares in hand: pid, our end of its socket, and whether it made a PID namespace
        # ahead (it can then run nothing outside that namespace).
        self._spares: list[tuple[int, socket.socket, bool]] = []
        # Spares asked for and not yet received, in order: whether each prepares one.
        self._asked: collections.deque[bool] = collections.deque()
        self._failed = False  # the zygote reported a failed fork since the last launch
        self._lock = asyncio.Lock()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def ensure_started(self) -> None:
        """Start a zygote unless one runs; does not wait for it to become ready."""
        if self._sock is not None and self.proc is not None and self.proc.poll() is None:
            return
        self.stop()
        if not hasattr(os, "fork"):
            return
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.proc = subprocess.Popen(
                zygote_argv(theirs.fileno()),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
                env=SUPERVISOR_ENV,
                close_fds=True,
            )
        except OSError:
            ours.close()
            log.warning("could not start the zygote", exc_info=True)
            return
        finally:
            theirs.close()
        ours.setblocking(False)
        self._sock = ours
        self._ready = False
        log.info("zygote started (pid %d)", self.proc.pid)

    def ready(self) -> bool:
        """True if a zygote is up and has said so (checked without blocking)."""
        return self._pump()

    def _pump(self) -> bool:
        """Read what the zygote sent (ready, spares) without blocking; False if it is gone."""
        sock, proc = self._sock, self.proc
        if sock is None or proc is None:
            return False
        try:
            while True:
                if not self._ready:
                    data = sock.recv(1)
                    if data != _zygote.READY:
                        raise EOFError  # it died while starting
                    self._ready = True
                    self._ask()
                    continue
                data, fds, _, _ = socket.recv_fds(sock, _zygote.PID.size, 1)
                if len(data) != _zygote.PID.size:
                    for fd in fds:
                        os.close(fd)
                    raise EOFError  # gone (or out of step, which is as bad)
                prepared = self._asked.popleft() if self._asked else False
                (pid,) = _zygote.PID.unpack(data)
                if pid == 0 or len(fds) != 1:
                    for fd in fds:
                        os.close(fd)
                    self._failed = True
                    continue
                channel = socket.socket(fileno=fds[0])
                channel.set_inheritable(False)
                channel.setblocking(False)
                self._spares.append((pid, channel, prepared))
        except (BlockingIOError, InterruptedError):
            pass
        except (OSError, EOFError):
            self.stop()
            return False
        if proc.poll() is not None:
            self.stop()  # its spares go with it: they read EOF and exit
            return False
        return self._ready

    def _ask(self, prepared: bool | None = None) -> None:
        """Ask for enough spares to hold ``wanted`` again: ``prepared`` ones (that make a
        PID namespace ahead) or not; by default as ``prepare_namespaces`` says."""
        missing = self.wanted - len(self._spares) - len(self._asked)
        if missing <= 0 or self._sock is None:
            return
        try:
            if self.prepare_namespaces is None:
                self.prepare_namespaces = sandbox.support().private_proc
            if prepared is None:
                prepared = self.prepare_namespaces
            self._sock.send((_zygote.FORK_PREPARED if prepared else _zygote.FORK) * missing)
        except (BlockingIOError, InterruptedError):
            return  # asked again at the next launch
        except OSError:
            return  # gone: the next _pump notices
        self._asked.extend([prepared] * missing)

    async def launch(
        self, spool: Path, spec: Mapping[str, Any], *, gated: bool = False
    ) -> tuple[int, socket.socket]:
        """Hand ``spec`` to a spare: the supervisor's pid, and a socket that reads EOF once it
        has recorded the outcome (or died). ZygoteError: see ``revoke_or_adopt``.

        ``gated``: the spare prepares everything but waits for :func:`go` on that socket
        before it starts the command (closing the socket instead withdraws it), so that the
        journal's fsync and the spare's preparation overlap.
        """
        confine = spec.get("landlock")
        namespace = bool(confine and confine.get("private_proc"))
        async with self._lock:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.spare_timeout
            while True:
                if not self._pump():
                    raise ZygoteError("the zygote is not running")
                if (taken := self._take(namespace)) is not None:
                    break
                if self._failed:
                    self._failed = False
                    raise ZygoteError("the zygote could not fork")
                self._ask(namespace)
                if loop.time() >= deadline or self._sock is None:
                    raise ZygoteError("no spare from the zygote in time")
                await _readable(loop, self._sock, deadline - loop.time())
            pid, channel = taken
            if self._spares:
                # Another spare is in hand: fork the replacement later, so that the fork does
                # not compete for the CPU with the command just handed over.
                loop.call_later(REPLENISH_LATEST, self._ask)
            else:
                self._ask()
            self._teach(confine)
            request = _zygote.encode({"spool": str(spool), "spec": dict(spec), "gated": gated})
            try:
                await loop.sock_sendall(channel, request)
            except BaseException as exc:
                channel.close()
                if isinstance(exc, OSError):
                    raise ZygoteError(f"the spare {pid} is gone: {exc}") from exc
                raise
            return pid, channel

    def _take(self, namespace: bool) -> tuple[int, socket.socket] | None:
        """A spare for a command that gets a PID namespace (``namespace``) or not.

        A prepared spare (one that made the namespace ahead) for the first, else any; an
        unprepared one for the second, since a prepared spare starts everything in its
        namespace. Spares of the kind no longer asked for go (the policy changed): each
        makes room for one of the right kind.
        """
        for i, (pid, channel, prepared) in enumerate(self._spares):
            if prepared == namespace:
                del self._spares[i]
                return pid, channel
        if namespace and self._spares:
            pid, channel, _ = self._spares.pop(0)
            return pid, channel
        for _, channel, _ in self._spares:
            channel.close()  # it exits without running anything
        self._spares.clear()
        return None

    def replenish(self) -> None:
        """A command ended: a good moment to fork the spares that are missing."""
        self._ask()

    def _teach(self, confine: Mapping[str, Any] | None) -> None:
        """Tell the zygote what this confined command's init needed that the next ones will
        most likely need too (the hidden sockets or the view, the read grants, the network
        namespace), so that its spares do
        it before their command is known (:mod:`endpointd.process.nsinit`)."""
        if not confine or not confine.get("private_proc") or self._sock is None:
            return
        lesson = {
            "read": confine.get("read") or [],
            "hidden_dirs": confine.get("hidden_dirs") or [],
            "hidden_files": confine.get("hidden_files") or [],
            "view": confine.get("view") or None,
            "netns": confine.get("netns") or "",
        }
        if lesson == self._taught:
            return
        try:
            # Blocking for this one rare write: a half-sent frame would derail the zygote.
            self._sock.setblocking(True)
            self._sock.sendall(_zygote.TEACH + _zygote.encode(lesson))
        except OSError:
            return  # a zygote that is gone is noticed by the next _pump
        finally:
            with contextlib.suppress(OSError):
                self._sock.setblocking(False)
        self._taught = lesson

    def stop(self) -> None:
        """Close our ends (the zygote and the spares exit on EOF); kill it if it lingers."""
        sock, proc = self._sock, self.proc
        self._sock, self.proc, self._ready = None, None, False
        self._asked.clear()
        self._taught = None  # a new zygote knows nothing yet
        for _, channel, _ in self._spares:
            channel.close()
        self._spares = []
        if sock is not None:
            sock.close()
        if proc is not None and proc.poll() is None:
            try:
                proc.wait(0.5)
            except subprocess.TimeoutExpired:
                proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(1)


def go(channel: socket.socket) -> None:
    """Let a gated spare start its command (see ``Zygote.launch``)."""
    channel.send(_zygote.GO)  # one byte into an empty socket buffer: never blocks


async def _readable(loop: asyncio.AbstractEventLoop, sock: socket.socket, timeout: float) -> None:
    """Until ``sock`` has something to read, or ``timeout`` passes."""
    ready: asyncio.Future[None] = loop.create_future()
    fd = sock.fileno()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ready, max(timeout, 0.0))
    finally:
        loop.remove_reader(fd)


def request_cancel(spool: Path, supervisor_pid: int, grace_seconds: int) -> bool:
    """Ask a supervisor to stop its command (SIGTERM to the group, grace, SIGKILL)."""
    atomic_write(
        spool / CANCEL_FILE,
        json.dumps({"grace_seconds": grace_seconds or DEFAULT_CANCEL_GRACE_SECONDS}).encode(),
        mode=0o600,
        fsync=False,
    )
    try:
        os.kill(supervisor_pid, signal.SIGUSR1)
    except ProcessLookupError:
        return False
    return True


def pid_alive(pid: int) -> bool:
    """True if ``pid`` runs (a zombie counts as dead: it will never write anything again)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError, IndexError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        # The state letter follows the parenthesised command name (which may hold spaces).
        if stat[stat.rindex(")") + 2] == "Z":
            return False
    return True
