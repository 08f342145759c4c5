"""A new workspace's setup step, run once, as any command is: under its own supervisor,
in the sandbox of the workspace, from a minimal environment, within the policy's runtime.

What runs is decided by :class:`endpointd.workspaces.manager.SetupPlan` (the owner's
``[workspaces.setup]`` command for the repository, else the repository's own
``.superagent/setup``); the daemon judges it with the policy and plans its sandbox, then
:func:`run` starts it (:mod:`endpointd.process.executor`) and waits. Its outcome, for the
answer: the exit code and the last :data:`TAIL_CHARS` characters of its output, masked by
the daemon's redactor. A failing setup leaves the workspace in place.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from endpointd.guard.confinement import Confinement
from endpointd.process.executor import ExecLimits, exec_spec, start_supervisor
from endpointd.secrets.delivery import Prepared as Delivery
from endpointd.spool import HEADER, OUTPUT_FILE, STREAM_DATA, ExitStatus
from endpointd.workspaces.store import Setup
from superagent_shared.messages import Exec

__all__ = ["TAIL_CHARS", "run"]

TAIL_CHARS = 2000
# Read this much of the end of the output (bytes) to make the tail: enough for the
# masking to see a secret whole at the cut.
_TAIL_BYTES = 16 * 1024
_POLL_SECONDS = 0.1
_EXIT_WAIT_SECONDS = 10.0


async def run(
    argv: Sequence[str],
    cwd: str,
    *,
    spool: Path,
    confinement: Confinement,
    limits: ExecLimits,
    passed_env: Sequence[str],
    redact: Callable[[str], str],
    delivery: Delivery | None = None,
    on_started: Callable[[int], None] | None = None,
) -> Setup:
    """Run the setup command to its end; its outcome."""
    ex = Exec(argv=tuple(argv), cwd=cwd)
    spec = exec_spec(
        spool,
        ex,
        limits=limits,
        default_cwd=Path(cwd),
        delivery=delivery,
        confinement=confinement,
        passed_env=passed_env,
    )
    proc = start_supervisor(spool, spec)
    if on_started is not None:
        on_started(proc.pid)
    # Its end is in the spool (status.json), as for any command: looked at, not awaited.
    status = ExitStatus.read(spool)
    while status is None and proc.poll() is None:
        await asyncio.sleep(_POLL_SECONDS)
        status = ExitStatus.read(spool)
    # It records its outcome just before it exits. (Cancelled meanwhile, the daemon is
    # stopping: the supervisor finishes the command on its own, as it would any.)
    with contextlib.suppress(subprocess.TimeoutExpired):
        await asyncio.to_thread(proc.wait, _EXIT_WAIT_SECONDS)
    status = status or ExitStatus.read(spool)
    tail = redact(_tail(spool))[-TAIL_CHARS:]
    if status is None:
        return Setup(
            ran=True, exit_code=-1, output_tail=tail or "the setup step's outcome is unknown"
        )
    if status.error:
        tail = f"{tail}\n{status.error}".strip()[-TAIL_CHARS:]
    exit_code = 128 + status.signal if status.signal else status.exit_code
    return Setup(ran=True, exit_code=exit_code, output_tail=tail)


def _tail(spool: Path) -> str:
    """The end of the command's output (stdout and stderr as they interleaved): the framing
    is walked header by header, and only the last records' data is read."""
    pieces: list[tuple[int, int]] = []
    try:
        with open(spool / OUTPUT_FILE, "rb") as f:
            pos = 0
            while len(header := os.pread(f.fileno(), HEADER.size, pos)) == HEADER.size:
                stream, length = HEADER.unpack(header)
                if stream != STREAM_DATA:
                    pieces.append((pos + HEADER.size, length))
                pos += HEADER.size + length
            out = bytearray()
            for start, length in reversed(pieces):
                out[:0] = os.pread(f.fileno(), length, start)
                if len(out) >= _TAIL_BYTES:
                    break
    except OSError:
        return ""
    return bytes(out[-_TAIL_BYTES:]).decode("utf-8", errors="replace")
