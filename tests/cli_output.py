"""Reading what a CLI under test printed: its one-line error, a terminal's output."""

from __future__ import annotations

import os
import select
import subprocess
import time


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    """The single ``Error: …`` line of a failed command (exit 1, no traceback)."""
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("Error: ")
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
