"""Small file-system primitives the daemon relies on for crash safety.

Every file endpointd writes that another process (or the next daemon after a crash) reads is
written atomically: a temp file in the same directory, fsync, then ``os.replace``. A reader
therefore sees the old content or the new, never a torn mix.

Imports only ``os`` and ``contextlib``: the exec supervisor uses this module, and it starts
once per command. Paths are ``str`` or any ``os.PathLike``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)


def _create_temp(directory: str, name: str) -> tuple[int, str]:
    """A new, empty 0600 file next to the target (what ``tempfile.mkstemp`` does, lighter)."""
    for _ in range(100):
        tmp = os.path.join(directory, f".{name}.{os.urandom(6).hex()}.tmp")
        try:
            return os.open(tmp, _TEMP_FLAGS, 0o600), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no usable temporary file name for {name} in {directory}")


def atomic_write(
    path: str | os.PathLike[str], data: bytes, *, mode: int = 0o600, fsync: bool = True
) -> None:
    """Replace ``path`` with ``data`` atomically, the new file having permission ``mode``."""
    path = os.fspath(path)
    directory, name = os.path.split(path)
    directory = directory or "."
    fd, tmp = _create_temp(directory, name)
    try:
        # Created 0600; chmod before any byte is written so a wider mode is never briefly
        # applied to a partially written secret, nor a narrower one kept by mistake.
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        if fsync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        _unlink_quietly(tmp)
        raise
    os.close(fd)
    try:
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    if fsync:
        fsync_dir(directory)


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a rename or creation in ``path`` durable (POSIX; a no-op where unsupported)."""
    if os.name != "posix":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def mode_bits(path: str | os.PathLike[str]) -> int:
    return os.stat(path).st_mode & 0o777


@contextlib.contextmanager
def exclusive_lock(path: str | os.PathLike[str]) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``path`` (created 0600) for the block.

    Serialises read-modify-write of small state files between the CLI and the daemon. On
    Windows (no fcntl) the block runs unlocked: the CLI works, writers are not serialised.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            import fcntl
        except ImportError:
            yield
            return
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
