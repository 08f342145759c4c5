"""The exec supervisor: ``python -m endpointd.process.supervisor SPOOL_DIR`` (spec JSON on stdin).

One supervisor runs per exec command, started by the daemon in a new session so that it
outlives the daemon: if endpointd is killed (crash, upgrade, ``kill -9``) the command keeps
running, its output keeps landing in the spool, and its exit status is recorded. A restarted
daemon re-attaches by watching the spool for ``status.json``; nothing is ever run twice.

The supervisor owns everything about the child's lifetime, so that it holds even while no
daemon is alive:

* the child runs in its own process group (pgid = child pid, recorded in ``child.pid``);
* stdout and stderr are read from pipes and appended to the spool as framed records in the
  order they arrive (no line buffering: bytes are passed on as soon as they are read);
* the timeout: SIGTERM to the whole group, the grace period, then SIGKILL;
* cancel: on SIGUSR1 the daemon's request in ``cancel`` is read and handled the same way;
  SIGTERM/SIGINT/SIGHUP to the supervisor itself are treated as a cancel with the default
  grace, so stopping a supervisor never leaves its command behind unrecorded;
* when the main child exits, whatever is left in its process group is SIGKILLed: a command's
  background jobs do not outlive it (a process that deliberately left the group with
  setsid is beyond reach, which is the documented escape hatch);
* on Linux the supervisor is a child subreaper, so orphaned grandchildren are reaped here
  instead of lingering as zombies of PID 1.

The spec carries the child's full environment and is passed on stdin, never on disk or in
argv, because brokered credentials are in it (:mod:`endpointd.secrets.delivery`). Its
``remove_after`` lists the credential files (and the git helper's socket) to delete once
the command has ended, which the supervisor does before it writes ``status.json``, daemon
or no daemon.

Standard library only: this starts once per command and must start fast: the daemon runs it
as ``python -I -S`` (no site-packages, no ``.pth`` processing, no environment variables)
with only the directory holding the ``endpointd`` package appended to ``sys.path`` (see
``executor.start_exec``), so it imports nothing but the standard library,
:mod:`endpointd.spoolformat` and :mod:`endpointd.fsutil`. ``python -m endpointd.process.supervisor
SPOOL_DIR`` works the same.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import selectors
import signal
import sys
import time

from endpointd.fsutil import atomic_write
from endpointd.spoolformat import (
    CANCEL_FILE,
    CHILD_PID_FILE,
    STATUS_FILE,
    STDIN_FILE,
    STREAM_STDERR,
    STREAM_STDOUT,
    SUPERVISOR_PID_FILE,
    SpoolWriter,
)

# Not `typing.TYPE_CHECKING`: importing typing alone costs milliseconds on every command.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType
    from typing import Any

# After the main child exits, how long to keep reading pipes that something outside the
# process group still holds open before giving up on the rest of the output.
DRAIN_SECONDS = 2.0
DEFAULT_GRACE_SECONDS = 10.0
PR_SET_CHILD_SUBREAPER = 36


def load_libc() -> Any:
    """libc via ctypes (for prctl); the zygote calls this once so forks inherit it."""
    from endpointd.libc import libc

    return libc()


def load_sandbox() -> None:
    """Import what confining a command needs; the zygote calls this once so that forks
    inherit it instead of importing it per command (and, for a root daemon, the id map of
    its commands' views, made once: :mod:`endpointd.commanduser`)."""
    from endpointd import commanduser
    from endpointd.guard import (  # noqa: F401
        capabilities,
        landlock,
        mountview,
        namespaces,
        netns,
        nosuid,
        seccomp,
    )
    from endpointd.libc import libc
    from endpointd.process import nsinit  # noqa: F401

    # Each function ctypes looks up is resolved and cached on first use, and the filter
    # against set-id files is built on first use: once here, not in every fork.
    for name in ("mount", "umount2", "syscall", "unshare", "setns", "prctl", "capget", "capset"):
        getattr(libc(), name)
    nosuid.prepare()

    if commanduser.applies():
        with contextlib.suppress(OSError):  # (made again, and told, where a view needs it)
            commanduser.userns_fd()


_subreaper = False


def become_subreaper() -> None:
    """Adopt orphaned descendants (Linux); once per process (the zygote's spares do it early)."""
    global _subreaper
    if _subreaper or not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(Exception):
        load_libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        _subreaper = True


def _kill_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def exit_status(
    exit_code: int,
    *,
    signal: int = 0,
    error: str = "",
    timed_out: bool = False,
    cancelled: bool = False,
    total_output_bytes: int = 0,
    started_at: float = 0.0,
    finished_at: float = 0.0,
) -> dict[str, Any]:
    """The content of ``status.json``: the fields of ``endpointd.spool.ExitStatus``."""
    return {
        "exit_code": exit_code,
        "signal": signal,
        "error": error,
        "timed_out": timed_out,
        "cancelled": cancelled,
        "total_output_bytes": total_output_bytes,
        "started_at": started_at,
        "finished_at": finished_at,
    }


def write_status(directory: str, status: dict[str, Any]) -> None:
    """Atomically: its presence is what tells the daemon the command ended.

    Not fsync'd (that was a third of a fast command's time in the supervisor): the daemon
    journals the result with a full fsync the moment the supervisor exits. Only a power cut
    while no daemon runs, before the kernel writes the file back, can lose it; the command
    is then reported with an unknown outcome, and never run again.
    """
    atomic_write(
        os.path.join(directory, STATUS_FILE), json.dumps(status).encode(), mode=0o600, fsync=False
    )


def _spawn_error(exc: OSError, argv: list[str], cwd: str | None) -> dict[str, Any]:
    now = time.time()
    if isinstance(exc, SandboxFailed):
        error, code = str(exc.strerror), 126
    elif cwd is not None and exc.filename == cwd:
        error = f"working directory {cwd} cannot be used: {exc.strerror}"
        code = 126
    elif isinstance(exc, FileNotFoundError):
        error, code = f"executable not found: {argv[0]}", 127
    elif isinstance(exc, PermissionError):
        error, code = f"permission denied executing {argv[0]}", 126
    else:
        error, code = f"cannot execute {argv[0]}: {exc.strerror or exc}", 126
    return exit_status(code, error=error, started_at=now, finished_at=now)


class _Flags:
    cancel = False
    terminate = False


class NotStarted(Exception):
    """The daemon withdrew the command before it was started (see ``supervise``'s gate)."""


def supervise(
    directory: str, spec: dict[str, Any], gate: Callable[[], bool] | None = None
) -> dict[str, Any]:
    """Run the command and return its status. ``gate``, if given, is asked right before the
    command is started: everything else is ready by then; False means do not start it."""
    argv: list[str] = list(spec["argv"])
    cwd: str | None = spec.get("cwd") or None
    env: dict[str, str] = dict(spec["env"])
    timeout = float(spec.get("timeout_seconds") or 0)
    grace_default = float(spec.get("kill_grace_seconds") or DEFAULT_GRACE_SECONDS)

    become_subreaper()
    flags = _Flags()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)

    def on_cancel(signum: int, frame: FrameType | None) -> None:
        flags.cancel = True

    def on_terminate(signum: int, frame: FrameType | None) -> None:
        flags.terminate = True

    signal.signal(signal.SIGUSR1, on_cancel)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_terminate)
    # A handler (rather than SIG_DFL) makes SIGCHLD write to the wakeup fd, so a child's
    # exit wakes the loop at once instead of at the next poll.
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)

    stdin_path = os.path.join(directory, STDIN_FILE)
    stdin_fd = os.open(stdin_path if spec.get("stdin") else os.devnull, os.O_RDONLY)
    writer = SpoolWriter(directory)
    started = time.time()
    try:
        if gate is not None and not gate():
            raise NotStarted
        for what in spec.get("unenforced") or ():
            print(f"endpointd supervisor: the sandbox cannot enforce {what}", file=sys.stderr)
        pgid, out_r, err_r = _spawn(argv, cwd, env, stdin_fd, spec.get("landlock"))
    except OSError as exc:
        writer.close()
        return _spawn_error(exc, argv, cwd)
    finally:
        os.close(stdin_fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(stdin_path)
    sel = selectors.DefaultSelector()
    streams = {out_r: STREAM_STDOUT, err_r: STREAM_STDERR}
    for fd in streams:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    # A namespace's init reports the command's end on a pipe, before its own (slow) exit:
    # its arrival must wake this loop as a SIGCHLD would.
    init_report = _INIT_STATUS.get(pgid)
    if init_report is not None:
        sel.register(init_report, selectors.EVENT_READ)

    start_mono = time.monotonic()
    deadline = start_mono + timeout if timeout > 0 else None
    kill_at: float | None = None
    exited_at: float | None = None
    timed_out = cancelled = False
    returncode: int | None = None
    rounds = 0
    pid_recorded = False

    def stop(grace: float) -> None:
        nonlocal kill_at
        _kill_group(pgid, signal.SIGTERM)
        kill_at = time.monotonic() + grace

    while True:
        now = time.monotonic()
        if returncode is None:
            returncode = _poll(pgid)
            if returncode is not None:
                exited_at = now
                # Background jobs of a finished command must not outlive it.
                _kill_group(pgid, signal.SIGKILL)
        if exited_at is not None and (len(streams) == 0 or now >= exited_at + DRAIN_SECONDS):
            break
        if returncode is None:
            if flags.cancel or flags.terminate:
                grace = grace_default
                if flags.cancel:
                    with contextlib.suppress(OSError, ValueError, TypeError):
                        with open(os.path.join(directory, CANCEL_FILE), "rb") as f:
                            request = json.loads(f.read())
                        grace = float(request.get("grace_seconds") or grace_default)
                flags.cancel = flags.terminate = False
                if not (cancelled or timed_out):
                    cancelled = True
                    stop(grace)
            if deadline is not None and now >= deadline and not (timed_out or cancelled):
                timed_out = True
                stop(grace_default)
            if kill_at is not None and now >= kill_at:
                _kill_group(pgid, signal.SIGKILL)
                kill_at = None
        if returncode is None and not pid_recorded and rounds:
            _record_child_pid(directory, pgid)
            pid_recorded = True
        rounds += 1
        waits = [1.0]
        if deadline is not None and not timed_out:
            waits.append(deadline - now)
        if kill_at is not None:
            waits.append(kill_at - now)
        if exited_at is not None:
            waits.append(exited_at + DRAIN_SECONDS - now)
        for key, _ in sel.select(max(0.0, min(waits))):
            fd = int(key.fd)
            if fd == wake_r:
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_r, 512):
                        pass
                continue
            if fd == init_report:
                sel.unregister(fd)  # read (and closed) by _poll on the next round
                init_report = None
                continue
            try:
                data = os.read(fd, 64 * 1024)
            except BlockingIOError:
                continue
            if data:
                writer.append(streams[fd], data)
            else:
                sel.unregister(fd)
                del streams[fd]
    if init_report is not None:
        sel.unregister(init_report)
    for fd in list(streams):
        sel.unregister(fd)
    os.close(out_r)
    os.close(err_r)
    _reap_group(pgid)
    writer.close()

    assert returncode is not None
    died_of = -returncode if returncode < 0 else 0
    return exit_status(
        # Shell convention for a signal death; `signal` is the authoritative field.
        128 + died_of if died_of else returncode,
        signal=died_of,
        timed_out=timed_out,
        cancelled=cancelled and died_of != 0,
        total_output_bytes=writer.total,
        started_at=started,
        finished_at=time.time(),
    )


def _record_child_pid(directory: str, pgid: int) -> None:
    """``child.pid``: a diagnostic for finding a command's processes (tests clean up with it).

    Written once the command has outlived its first wait, so a command that ends at once
    never waits for a file to be created; in place rather than atomically, since its
    readers skip an empty file.
    """
    with contextlib.suppress(OSError):
        fd = os.open(
            os.path.join(directory, CHILD_PID_FILE), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600
        )
        try:
            os.write(fd, str(pgid).encode())
        finally:
            os.close(fd)


def _spawn(
    argv: list[str],
    cwd: str | None,
    env: dict[str, str],
    stdin_fd: int,
    confine: dict[str, Any] | None = None,
) -> tuple[int, int, int]:
    """Start the command in a process group of its own: (pid = pgid, stdout, stderr fds).

    ``posix_spawn`` (a vfork and exec in C) rather than ``subprocess.Popen``, whose Python
    side costs most of a millisecond in a freshly forked process, where every page it
    touches is copied first. What Popen did for us is done here: the working directory is
    the supervisor's own (it has no other use for one), the program is looked up on the
    command's PATH, SIGPIPE and SIGXFSZ are reset to their defaults (Python ignores them,
    and ignored signals survive an exec, which would change how ``cmd | head`` behaves), and
    the only fds passed on are 0/1/2: every other fd here is close-on-exec, as Python makes
    them.
    """
    if cwd is not None:
        os.chdir(cwd)
    program = _find_program(argv[0], env)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        if _prepared is not None or (confine is not None and confine.get("private_proc")):
            streams = (stdin_fd, out_w, err_w)
            return _spawn_in_namespace(program, argv, env, streams, confine), out_r, err_r
        if confine is not None:
            return (
                _spawn_confined(program, argv, env, stdin_fd, out_w, err_w, confine),
                out_r,
                err_r,
            )
        pid = os.posix_spawn(
            program,
            argv,
            env,
            file_actions=[
                (os.POSIX_SPAWN_DUP2, stdin_fd, 0),
                (os.POSIX_SPAWN_DUP2, out_w, 1),
                (os.POSIX_SPAWN_DUP2, err_w, 2),
            ],
            setpgroup=0,
            setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
            setsigmask=(),
        )
    except BaseException:
        os.close(out_r)
        os.close(err_r)
        raise
    finally:
        os.close(out_w)
        os.close(err_w)
    return pid, out_r, err_r


class SandboxFailed(OSError):
    """The command's sandbox could not be applied; it did not run."""


def _spawn_confined(
    program: str,
    argv: list[str],
    env: dict[str, str],
    stdin_fd: int,
    out_w: int,
    err_w: int,
    confine: dict[str, Any],
) -> int:
    """Start ``program`` confined without a PID namespace (where there is none): a forked
    child confines itself and execs; returns its pid, the command's process group. What
    fails is reported back and raised here: a command that could not be confined is an
    error, never run unconfined.
    """
    from endpointd.guard import capabilities, landlock

    rules = landlock.Ruleset(
        connect_ports=confine.get("connect_ports"), bind_ports=confine.get("bind_ports")
    )
    grants = [
        (str(path), int(rights))
        for path, rights in [*(confine.get("read") or ()), *(confine.get("grants") or ())]
    ]
    network = str(confine.get("seccomp") or "")
    install_seccomp: Callable[[str], None] | None = None
    if network:
        from endpointd.guard import seccomp

        install_seccomp = seccomp.install
    report_r, report_w = os.pipe()
    try:
        pid = os.fork()
    except BaseException:
        os.close(report_r)
        os.close(report_w)
        raise
    if pid == 0:  # the child: system calls only, then exec or _exit
        step = "setup"
        try:
            os.close(report_r)
            os.setpgid(0, 0)
            step = "capabilities"
            capabilities.drop_all()
            step = "landlock"
            landlock.enforce(landlock.create(rules, grants))
            if install_seccomp is not None:
                step = "seccomp"
                install_seccomp(network)
            step = "exec"
            os.dup2(stdin_fd, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            for sig in (signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(sig, signal.SIG_DFL)
            os.execve(program, argv, env)  # noqa: S606 - argv as given, never a shell
        except BaseException as exc:
            code = exc.errno if isinstance(exc, OSError) and exc.errno else errno.EPERM
            with contextlib.suppress(BaseException):
                os.write(report_w, f"{code}:{step}".encode())
        finally:
            os._exit(127)
    os.close(report_w)
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)  # also here: the group must exist before we might signal it
    try:
        report = os.read(report_r, 256)
    finally:
        os.close(report_r)
    if report:  # else exec'd: the close-on-exec pipe closed
        _poll_blocking(pid)
        _raise_report(report, argv)
    return pid


# The namespace init this spare prepared while it waited for a request (see prepare_init).
_prepared: Any = None


def prepare_init(preparation: dict[str, Any] | None) -> None:
    """In a spare: make the namespace and init a confined command will need, ahead of the
    request (:mod:`endpointd.process.nsinit`; ``preparation``: what the last confined
    command's init was given, see ``Zygote.teach``). Failing here costs nothing: the
    command's own attempt reports why."""
    global _prepared
    from endpointd.process import nsinit

    with contextlib.suppress(OSError):
        _prepared = nsinit.prepare(preparation)


def _spawn_in_namespace(
    program: str,
    argv: list[str],
    env: dict[str, str],
    streams: tuple[int, int, int],
    confine: dict[str, Any] | None,
) -> int:
    """Start ``program`` through the init of a PID namespace of its own
    (:mod:`endpointd.process.nsinit`): the one this spare prepared while it waited, or one
    made now. Returns the init's pid, the command's process group; what fails in the init
    is raised here, and a command that could not be confined never runs."""
    global _prepared
    from endpointd.process import nsinit

    init, _prepared = _prepared, None
    if init is None:
        try:
            init = nsinit.prepare()
        except OSError as exc:
            raise SandboxFailed(
                exc.errno or errno.EPERM,
                f"the sandbox could not be applied (private /proc): {exc.strerror or exc}",
            ) from None
    report_r, report_w = os.pipe()
    try:
        init.start(program, argv, env, (*streams, report_w), confine)
    except BaseException:
        os.close(report_r)
        init.discard()
        raise
    finally:
        os.close(report_w)
    _INIT_STATUS[init.pid] = init.status
    with contextlib.suppress(OSError):
        os.setpgid(init.pid, init.pid)  # the init does it too: the group exists either way
    try:
        report = _read_all(report_r)
    finally:
        os.close(report_r)
    if report == nsinit.STARTED:
        return int(init.pid)
    _poll_blocking(init.pid)
    os.close(_INIT_STATUS.pop(init.pid))
    _raise_report(report or b"%d:setup" % errno.EPERM, argv)
    raise AssertionError("unreachable")


def _read_all(fd: int) -> bytes:
    data = b""
    while chunk := os.read(fd, 256):
        data += chunk
    return data


def _raise_report(report: bytes, argv: list[str]) -> None:
    """Raise what a child wrote on its report pipe (``errno:step``)."""
    code_text, _, step = report.decode("ascii", "replace").partition(":")
    code = int(code_text) if code_text.isdigit() else errno.EPERM
    if step == "exec":
        raise OSError(code, os.strerror(code), argv[0])
    raise SandboxFailed(code, f"the sandbox could not be applied ({step}): {os.strerror(code)}")


# The namespace init's pid -> the pipe on which it reports how the command ended.
_INIT_STATUS: dict[int, int] = {}
# Inits whose report came in: they are on their way out (tearing the namespace down) and are
# neither waited for nor reaped here.
_INIT_EXITING: set[int] = set()


def _poll_blocking(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _find_program(name: str, env: dict[str, str]) -> str:
    """Where ``execvp`` would find ``name`` on the command's PATH (not the supervisor's)."""
    if not name or "/" in name:
        return name
    denied: OSError | None = None
    for directory in env.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(directory or ".", name)
        try:
            if os.path.isfile(candidate):
                if os.access(candidate, os.X_OK):
                    return candidate
                denied = PermissionError(errno.EACCES, os.strerror(errno.EACCES), name)
        except OSError:
            continue
    raise denied or FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), name)


def _poll(pid: int) -> int | None:
    """The command's return code once it has exited (negative: killed by that signal).

    For a command in a PID namespace of its own, ``pid`` is the namespace's init, whose
    report says how the command itself ended (an init cannot die of the command's signal);
    it comes before the init's own exit, which waits for the namespace to be torn down.
    """
    report_fd = _INIT_STATUS.get(pid)
    if report_fd is not None:
        readable, _, _ = select.select([report_fd], [], [], 0)
        if readable:
            text = os.read(report_fd, 32).decode("ascii", "replace").strip()
            os.close(_INIT_STATUS.pop(pid))
            if text.lstrip("-").isdigit():
                _INIT_EXITING.add(pid)
                return int(text)
            # EOF without a report: the init itself died (killed with the group).
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return -signal.SIGKILL  # reaped elsewhere: cannot happen, but never spin on it
    if done == 0:
        return None
    report_fd = _INIT_STATUS.pop(pid, None)
    if report_fd is not None:
        os.close(report_fd)
    return os.waitstatus_to_exitcode(status)


def _reap_group(pgid: int) -> None:
    """Kill and reap what is left of the group (reparented to us as subreaper).

    A namespace's init that has reported is not waited for: its exit waits for the kernel
    to tear the namespace down, which takes milliseconds and ends everything in it anyway.
    """
    _kill_group(pgid, signal.SIGKILL)
    if pgid in _INIT_EXITING:
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        return
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass
        if not _group_exists(pgid):
            return
        time.sleep(0.01)


def remove_paths(paths: list[str]) -> None:
    """Delete what the spec's ``remove_after`` lists (files, then the emptied directories):
    the credential files and git helper socket of :mod:`endpointd.secrets.delivery`."""
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            try:
                os.rmdir(path)  # a directory: unlink says EISDIR (Linux) or EPERM (macOS)
            except FileNotFoundError:
                pass
            except OSError:
                print(
                    f"endpointd supervisor: cannot remove {path}: {exc.strerror}", file=sys.stderr
                )


def run_spec(directory: str, spec: dict[str, Any], gate: Callable[[], bool] | None = None) -> None:
    """Supervise ``spec`` and record the outcome; shared by both ways a supervisor starts."""
    try:
        status = supervise(directory, spec, gate)
    except NotStarted:
        return  # the daemon records what happened; nothing ran, so there is no status
    except Exception as exc:  # recorded, so the daemon reports it instead of "unknown"
        now = time.time()
        error = f"endpointd supervisor failed: {type(exc).__name__}: {exc}"
        status = exit_status(-1, error=error, started_at=now, finished_at=now)
        print(error, file=sys.stderr)
    finally:
        # The command and its process group are gone (or it never started): its delivered
        # credentials go now, before the outcome is recorded, and even if no daemon runs.
        remove_paths(list(spec.get("remove_after") or ()))
    # The last thing before exiting: the daemon learns of the end from this process's exit
    # (pidfd) or from this file (polling), and reads this file either way.
    write_status(directory, status)


def main() -> None:
    directory = os.path.abspath(sys.argv[1])
    # First thing: a daemon that crashed before journaling our pid can still find us.
    atomic_write(
        os.path.join(directory, SUPERVISOR_PID_FILE), str(os.getpid()).encode(), fsync=False
    )
    spec = json.loads(sys.stdin.buffer.read())
    # Nothing else is read from the daemon; keep fd 0 valid but inert.
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    run_spec(directory, spec)


def run() -> None:
    """The entry point, for ``-m`` and for the daemon's ``-c`` bootstrap alike.

    ``--zygote FD`` runs the pre-forked zygote instead (:mod:`endpointd.process.zygote`).
    """
    with contextlib.suppress(OSError):
        # The supervisor must not die of SIGPIPE on its diagnostics log.
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    try:
        if sys.argv[1:2] == ["--zygote"]:
            from endpointd.process.zygote import serve

            serve(int(sys.argv[2]))
        else:
            main()
    except OSError as exc:
        if exc.errno != errno.EPIPE:
            raise


if __name__ == "__main__":
    run()
