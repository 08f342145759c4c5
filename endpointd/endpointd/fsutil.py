"""Small file-system primitives the daemon relies on for crash safety.

Every file endpointd writes that another process (or the next daemon after a crash) reads is
written atomically: a temp file in the same directory, fsync, then ``os.replace``. A reader
therefore sees the old content or the new, never a torn mix.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def atomic_write(path: Path, data: bytes, *, mode: int = 0o600, fsync: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically, the new file having permission ``mode``."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp creates 0600; chmod before any byte is written so a wider mode is never
        # briefly applied to a partially written secret, nor a narrower one kept by mistake.
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        if fsync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    os.close(fd)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if fsync:
        fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    """Make a rename or creation in ``path`` durable (POSIX; a no-op where unsupported)."""
    if os.name != "posix":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def mode_bits(path: Path) -> int:
    return path.stat().st_mode & 0o777
