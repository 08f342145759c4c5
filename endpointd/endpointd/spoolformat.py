"""The spool's on-disk format and its writer, importable at almost no cost.

Split from :mod:`endpointd.spool` because the exec supervisor imports it: one supervisor
starts per command, so this module and :mod:`endpointd.fsutil` import only ``os``,
``struct`` and ``contextlib`` (no ``pathlib``, ``re``, ``dataclasses``, ``typing``). Paths
are ``str`` or any ``os.PathLike``. See :mod:`endpointd.spool` for the layout of a spool directory.
"""

from __future__ import annotations

import os
import struct

STREAM_STDOUT = 1
STREAM_STDERR = 2
STREAM_DATA = 3

HEADER = struct.Struct(">BI")
# Bounded records keep any single read small; the reader merges adjacent records of the same
# stream into chunks of up to MAX_OUTPUT_CHUNK_BYTES anyway.
MAX_RECORD = 64 * 1024

OUTPUT_FILE = "output"
STATUS_FILE = "status.json"
CANCEL_FILE = "cancel"
STDIN_FILE = "stdin"
CHILD_PID_FILE = "child.pid"
SUPERVISOR_PID_FILE = "supervisor.pid"
SUPERVISOR_LOG = "supervisor.log"
# The command's private TMPDIR (the only place outside its workspace it may write).
TMP_DIR = "tmp"


class SpoolWriter:
    """Appends framed records to ``output``; one writer per command."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self._path = os.path.join(directory, OUTPUT_FILE)
        self._fd = -1  # created with the first record: many commands print nothing
        self.total = 0

    def append(self, stream: int, data: bytes) -> None:
        if self._fd < 0:
            # O_APPEND: even if a stray second writer existed, records would not interleave
            # inside each other (each record is one write() call).
            self._fd = os.open(
                self._path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600
            )
        for start in range(0, len(data), MAX_RECORD):
            piece = data[start : start + MAX_RECORD]
            record = HEADER.pack(stream, len(piece)) + piece
            view = memoryview(record)
            while view:
                view = view[os.write(self._fd, view) :]
            self.total += len(piece)

    def close(self, *, fsync: bool = False) -> None:
        """Close; ``fsync`` also makes the records durable.

        Off by default: output is sent from here to the server, which stores it; a power cut
        before that loses the command's outcome too (see ``_supervise.write_status``).
        """
        if self._fd < 0:
            return
        if fsync and self.total:
            os.fsync(self._fd)
        os.close(self._fd)
        self._fd = -1
