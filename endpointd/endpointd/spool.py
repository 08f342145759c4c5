"""Per-command output spools: the durable, append-only record of what a command produced.

Each command gets a directory ``<state dir>/spool/<command id>/``:

``output``
    Framed records ``stream (1 byte) || length (4 bytes, big-endian) || data``, appended in
    the order the bytes were produced. The command's combined output offset of a byte is
    the sum of the data lengths before it, exactly the OutputChunk.offset it is sent with.
    Streams: 1 stdout, 2 stderr, 3 data (values of OutputChunk.Stream).
``status.json``
    Written atomically once, after the last output byte is durable: how the command ended.
    Its presence is the "finished" signal, for the daemon that started the command and for
    a restarted daemon that re-attaches to it.
``cancel``
    A cancel request from the daemon (JSON ``{"grace_seconds": N}``), read by the supervisor
    when it receives SIGUSR1.
``stdin``, ``child.pid``, ``supervisor.pid``, ``supervisor.log``
    Input for the command (unlinked once the child has it open), the command's process
    group id, the supervisor's pid, and the supervisor's own diagnostics.

Output lives on disk rather than in memory so that memory stays bounded whatever a command
prints, and so output survives a daemon crash and is resent after a reconnect from whatever
offset the server acknowledged. This module uses only the standard library because the
exec supervisor imports it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from endpointd.fsutil import atomic_write

# The format and its writer live in a module light enough for the supervisor to import.
from endpointd.spoolformat import (
    CANCEL_FILE,
    CHILD_PID_FILE,
    HEADER,
    MAX_RECORD,
    OUTPUT_FILE,
    STATUS_FILE,
    STDIN_FILE,
    STREAM_DATA,
    STREAM_STDERR,
    STREAM_STDOUT,
    SUPERVISOR_LOG,
    SUPERVISOR_PID_FILE,
    TMP_DIR,
    SpoolWriter,
)

__all__ = [
    "CANCEL_FILE",
    "CHILD_PID_FILE",
    "HEADER",
    "MAX_RECORD",
    "OUTPUT_FILE",
    "STATUS_FILE",
    "STDIN_FILE",
    "STREAM_DATA",
    "STREAM_STDERR",
    "STREAM_STDOUT",
    "SUPERVISOR_LOG",
    "SUPERVISOR_PID_FILE",
    "TMP_DIR",
    "ExitStatus",
    "SpoolReader",
    "SpoolWriter",
    "output_total",
    "read_all",
    "read_pid",
    "remove_spool",
    "spool_dir",
]

_HEADER = HEADER

_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def spool_dir(state_dir: Path, command_id: str) -> Path:
    """The spool directory of a command; ids are server-chosen, so never trusted as paths."""
    if _SAFE_ID.match(command_id) and ".." not in command_id:
        name = command_id
    else:
        name = "x-" + command_id.encode("utf-8", "surrogatepass").hex()[:200]
    return state_dir / "spool" / name


def remove_spool(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


@dataclass(frozen=True)
class ExitStatus:
    """How a command ended; the content of ``status.json``."""

    exit_code: int
    signal: int = 0
    error: str = ""
    timed_out: bool = False
    cancelled: bool = False
    total_output_bytes: int = 0
    started_at: float = 0.0
    finished_at: float = 0.0

    def write(self, directory: Path) -> None:
        atomic_write(directory / STATUS_FILE, json.dumps(asdict(self)).encode(), mode=0o600)

    @classmethod
    def read(cls, directory: Path) -> ExitStatus | None:
        try:
            raw = json.loads((directory / STATUS_FILE).read_bytes())
        except FileNotFoundError:
            return None
        return cls(**raw)


class SpoolReader:
    """Random access to a spool's combined output by offset, tolerant of a growing file.

    Keeps a cursor at the record holding the last position read, so sequential reading is
    O(1) per chunk; reading before the cursor (a resend after reconnect) rescans from the
    start, which is rare and touches only headers. Memory is O(1) in the output size.
    """

    def __init__(self, directory: Path) -> None:
        self._path = directory / OUTPUT_FILE
        self._fd = -1
        self._pos = 0  # file position of a record header
        self._rec_offset = 0  # output offset of that record's first data byte

    def _open(self) -> bool:
        if self._fd < 0:
            try:
                self._fd = os.open(self._path, os.O_RDONLY)
            except FileNotFoundError:
                return False
        return True

    def size_hint(self) -> int:
        """The file's byte size (headers included): cheap growth detection."""
        try:
            return self._path.stat().st_size
        except FileNotFoundError:
            return 0

    def read(self, offset: int, limit: int) -> tuple[int, bytes] | None:
        """Up to ``limit`` bytes of one stream starting at ``offset``, or None if none yet."""
        if not self._open():
            return None
        if offset < self._rec_offset:
            self._pos, self._rec_offset = 0, 0
        pos, rec_off = self._pos, self._rec_offset
        out = bytearray()
        stream: int | None = None
        while len(out) < limit:
            header = os.pread(self._fd, _HEADER.size, pos)
            if len(header) < _HEADER.size:
                break
            rec_stream, length = _HEADER.unpack(header)
            if rec_off + length <= offset:
                pos += _HEADER.size + length
                rec_off += length
                continue
            if stream is None:
                stream = rec_stream
            elif rec_stream != stream:
                break
            start = offset + len(out) - rec_off
            want = min(length - start, limit - len(out))
            data = os.pread(self._fd, want, pos + _HEADER.size + start)
            out += data
            if len(data) < want or start + want < length:
                break  # record still being written, or limit reached inside it
            pos += _HEADER.size + length
            rec_off += length
        self._pos, self._rec_offset = pos, rec_off
        if stream is None or not out:
            return None
        return stream, bytes(out)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def output_total(directory: Path) -> int:
    """Data bytes in a spool (headers skipped), e.g. for a command whose end was lost."""
    total = 0
    try:
        with open(directory / OUTPUT_FILE, "rb") as f:
            while True:
                header = f.read(_HEADER.size)
                if len(header) < _HEADER.size:
                    break
                _, length = _HEADER.unpack(header)
                available = len(f.read(length))
                total += available
                if available < length:
                    break
    except FileNotFoundError:
        pass
    return total


def read_all(directory: Path) -> list[tuple[int, bytes]]:
    """Every record as (stream, data); for tests and diagnostics on small spools."""
    out: list[tuple[int, bytes]] = []
    try:
        data = (directory / OUTPUT_FILE).read_bytes()
    except FileNotFoundError:
        return out
    pos = 0
    while pos + _HEADER.size <= len(data):
        stream, length = _HEADER.unpack_from(data, pos)
        out.append((stream, data[pos + _HEADER.size : pos + _HEADER.size + length]))
        pos += _HEADER.size + length
    return out
