"""Starting exec commands under their supervisor, cancelling them, and checking on them.

The daemon never runs a command as its own child: it starts the supervisor
(``endpointd._supervise``) in a new session and hands it the spec on stdin (see that module
for why). Everything here is about that hand-off and about the supervisor's pid, which is all a
daemon - this one or a restarted one - needs to cancel a command or to notice that its
supervisor died without recording an outcome.

A "shell string" needs nothing special: the control plane sends ``argv = ["sh", "-c",
"..."]`` and the shell is just the program that runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from endpointd.fsutil import atomic_write
from endpointd.spool import CANCEL_FILE, STDIN_FILE, SUPERVISOR_LOG
from superagent_proto.v1 import endpoint_pb2

DEFAULT_CANCEL_GRACE_SECONDS = 10

# The directory holding the `endpointd` package (site-packages for a wheel, the source tree
# for an editable install): the only entry the supervisor adds to the bare interpreter's
# sys.path. Appended, so it can never shadow a standard-library module.
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# -I: no PYTHON* variables, no user site, no script/cwd directory on sys.path; -S: no
# site-packages and no .pth processing. Together they halve the supervisor's start-up cost,
# which every command pays. argv[1] (the package root) is popped before the supervisor runs,
# so it sees the same argv as `python -m endpointd._supervise SPOOL_DIR`.
_BOOTSTRAP = (
    "import sys; sys.path.append(sys.argv.pop(1)); import endpointd._supervise as s; s.run()"
)


def supervisor_argv(spool: Path) -> list[str]:
    """How the daemon starts a supervisor: a bare interpreter that imports only endpointd."""
    return [sys.executable, "-I", "-S", "-c", _BOOTSTRAP, _PACKAGE_ROOT, str(spool)]


@dataclass(frozen=True)
class ExecLimits:
    # The cap for every command and the value used when timeout_seconds is 0.
    max_timeout_seconds: int = 3600
    kill_grace_seconds: int = DEFAULT_CANCEL_GRACE_SECONDS


def child_environment(extra: Mapping[str, str]) -> dict[str, str]:
    """The command's environment: the daemon's own, with the command's variables on top."""
    return {**os.environ, **extra}


def start_exec(
    spool: Path,
    ex: endpoint_pb2.ExecCommand,
    *,
    limits: ExecLimits,
    default_cwd: Path,
) -> subprocess.Popen[bytes]:
    """Start the supervisor for ``ex``; returns at once, the command runs detached."""
    spool.mkdir(parents=True, exist_ok=True, mode=0o700)
    timeout = ex.timeout_seconds or limits.max_timeout_seconds
    spec = {
        "argv": list(ex.argv),
        "cwd": ex.cwd or str(default_cwd),
        "env": child_environment(dict(ex.env)),
        "timeout_seconds": min(timeout, limits.max_timeout_seconds),
        "kill_grace_seconds": limits.kill_grace_seconds,
        "stdin": ex.HasField("stdin"),
    }
    if ex.HasField("stdin"):
        atomic_write(spool / STDIN_FILE, ex.stdin, mode=0o600, fsync=False)
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
