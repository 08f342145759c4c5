"""Running a CLI under test: its one-line error, or a session in a pseudo-terminal."""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    """The single ``error: …`` line of a failed command (exit 1, no traceback): both
    programs say click's failures the same way as their own."""
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


def read_until(fd: int, needle: bytes, deadline: float) -> bytes:
    """What a pseudo-terminal's master ``fd`` shows until ``needle`` (or its end)."""
    seen = b""
    while needle not in seen:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"never saw {needle!r}; got {seen!r}"
        ready, _, _ = select.select([fd], [], [], remaining)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
    return seen


def read_to_end(fd: int) -> bytes:
    """Everything a pseudo-terminal's master ``fd`` shows until its writers are gone (the
    read fails with EIO then); ``fd`` is closed."""
    seen = b""
    try:
        while chunk := os.read(fd, 4096):
            seen += chunk
    except OSError:  # EIO: the writer is gone
        pass
    finally:
        os.close(fd)
    return seen


@contextlib.contextmanager
def in_a_terminal(
    args: list[str], env: Mapping[str, str]
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """``python -m endpointd ARGS`` on a new pseudo-terminal: (the process, the pty's master
    end to read its prompts from and answer on). Killed if still running at the end."""
    master, slave = os.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "endpointd", *args],
        cwd=tempfile.gettempdir(),
        env=dict(env),
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
    )
    os.close(slave)
    try:
        yield proc, master
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
        os.close(master)
