"""The command journal: a local SQLite file that makes every command run at most once.

A command is written here (and committed with a full fsync) BEFORE the daemon acts on it,
so whatever happens next - a dropped stream, a redelivery, a daemon crash, a power cut -
the next daemon knows the command exists and in which state. The states that stop a second
run (journaled on receipt, ``running`` before it is started) are committed with
``synchronous=FULL``. The result is committed with ``synchronous=NORMAL`` and fsync'd right
after it has been handed to the stream (:meth:`Journal.sync`), so the disk is not on the
path of reporting it. Bookkeeping whose loss in a power cut costs at most a resend (the
supervisor pid, acked offsets, compaction of acknowledged rows) is committed with
``synchronous=NORMAL`` alone. In WAL mode a NORMAL commit survives a crash of the process,
and becomes durable with the next FULL commit, checkpoint or sync. Schema (one table)::

    commands(
      command_id   TEXT PRIMARY KEY,  -- the idempotency key
      seq          INTEGER,           -- delivery order, for starting in order
      body         BLOB,              -- the serialized Command; NULL once acked (compacted)
      body_sha256  BLOB,              -- what a redelivery is compared against
      state        TEXT,              -- accepted | running | finished | acked
      accepted     INTEGER,           -- 1 if Accepted was sent (replayed on redelivery)
      acked_offset INTEGER,           -- next output offset the server has NOT acknowledged
      result       BLOB,              -- serialized DeviceMessage (Finished or Refused)
      pid          INTEGER,           -- the exec supervisor's pid while running
      received_at, started_at, finished_at, acked_at  REAL  -- unix seconds
    )

``acked`` rows are compact (no body, no spool) and kept ``RETENTION_SECONDS`` so that a
late redelivery is still recognised, then pruned. The database runs in WAL mode so
`endpointd status` can read it while the daemon writes.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

State = Literal["accepted", "running", "finished", "acked"]
ACTIVE_STATES: tuple[State, ...] = ("accepted", "running", "finished")

JOURNAL_FILE = "journal.sqlite3"
RETENTION_SECONDS = 7 * 24 * 3600

_SCHEMA = """
CREATE TABLE IF NOT EXISTS commands (
    command_id   TEXT PRIMARY KEY,
    seq          INTEGER NOT NULL,
    body         BLOB,
    body_sha256  BLOB NOT NULL,
    state        TEXT NOT NULL,
    accepted     INTEGER NOT NULL DEFAULT 0,
    acked_offset INTEGER NOT NULL DEFAULT 0,
    result       BLOB,
    pid          INTEGER,
    received_at  REAL NOT NULL,
    started_at   REAL,
    finished_at  REAL,
    acked_at     REAL
);
CREATE INDEX IF NOT EXISTS commands_state ON commands (state, seq);
"""


@dataclass(frozen=True)
class Entry:
    command_id: str
    seq: int
    body: bytes | None
    body_sha256: bytes
    state: State
    accepted: bool
    acked_offset: int
    result: bytes | None
    pid: int | None
    received_at: float
    started_at: float | None
    finished_at: float | None


_COLUMNS = (
    "command_id, seq, body, body_sha256, state, accepted, acked_offset, result, pid,"
    " received_at, started_at, finished_at"
)


def _entry(row: tuple[object, ...]) -> Entry:
    (cid, seq, body, digest, state, accepted, acked, result, pid, recv, start, fin) = row
    return Entry(
        command_id=str(cid),
        seq=int(seq),  # type: ignore[call-overload]
        body=body,  # type: ignore[arg-type]
        body_sha256=digest,  # type: ignore[arg-type]
        state=state,  # type: ignore[arg-type]
        accepted=bool(accepted),
        acked_offset=int(acked),  # type: ignore[call-overload]
        result=result,  # type: ignore[arg-type]
        pid=pid,  # type: ignore[arg-type]
        received_at=recv,  # type: ignore[arg-type]
        started_at=start,  # type: ignore[arg-type]
        finished_at=fin,  # type: ignore[arg-type]
    )


class Journal:
    """Synchronous access to the journal; every call is one short transaction."""

    def __init__(self, path: Path, *, readonly: bool = False) -> None:
        self.path = path
        if readonly:
            self._db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
            return
        self._db = sqlite3.connect(path, isolation_level=None)
        path.chmod(0o600)
        self._db.execute("PRAGMA journal_mode=WAL")
        # FULL: a commit survives power loss, not just a process crash. A command journaled
        # but lost would be run again on redelivery, which is what this file exists to stop.
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    def _relaxed(self, sql: str, params: tuple[object, ...]) -> sqlite3.Cursor:
        """One statement committed without waiting for fsync (crash-safe, not power-safe)."""
        self._db.execute("PRAGMA synchronous=NORMAL")
        try:
            return self._db.execute(sql, params)
        finally:
            self._db.execute("PRAGMA synchronous=FULL")

    def get(self, command_id: str) -> Entry | None:
        row = self._db.execute(
            f"SELECT {_COLUMNS} FROM commands WHERE command_id = ?",
            (command_id,),
        ).fetchone()
        return _entry(row) if row else None

    def active(self) -> list[Entry]:
        """Every command not yet fully acknowledged, in delivery order."""
        rows = self._db.execute(
            f"SELECT {_COLUMNS} FROM commands WHERE state IN (?, ?, ?) ORDER BY seq",
            ACTIVE_STATES,
        ).fetchall()
        return [_entry(r) for r in rows]

    def insert(
        self,
        *,
        command_id: str,
        seq: int,
        body: bytes,
        body_sha256: bytes,
        state: State,
        accepted: bool,
        result: bytes | None = None,
        durable: bool = True,
    ) -> None:
        """Journal a command; ``durable=False`` leaves the fsync to the caller (:meth:`sync`),
        who must not act on the command before it has completed."""
        now = time.time()
        execute = self._db.execute if durable else self._relaxed
        execute(
            "INSERT INTO commands (command_id, seq, body, body_sha256, state, accepted, result,"
            " received_at, started_at, finished_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                command_id,
                seq,
                body,
                body_sha256,
                state,
                int(accepted),
                result,
                now,
                now if state == "running" else None,
                now if state == "finished" else None,
            ),
        )

    def mark_running(self, command_id: str) -> None:
        self._db.execute(
            "UPDATE commands SET state = 'running', started_at = ? WHERE command_id = ?",
            (time.time(), command_id),
        )

    def set_pid(self, command_id: str, pid: int) -> None:
        # Not durable: after a power cut no pid means anything; after a crash, WAL has it.
        self._relaxed("UPDATE commands SET pid = ? WHERE command_id = ?", (pid, command_id))

    def finish(self, command_id: str, result: bytes, *, durable: bool = True) -> None:
        """Record the result; with a lost ``acked`` (below) that costs only a resend.

        ``durable=False`` commits without waiting for the disk (crash-safe at once); the
        caller then calls :meth:`sync` soon, so that the fsync is off the path of reporting
        the result. A power cut in between costs at most an "unknown outcome" report of a
        command whose result the server may already hold, never a second run: the command
        was journaled ``running`` durably before it started.
        """
        sql = (
            "UPDATE commands SET state = 'finished', result = ?, finished_at = ?"
            " WHERE command_id = ? AND state <> 'acked'"
        )
        params = (result, time.time(), command_id)
        if durable:
            self._db.execute(sql, params)
        else:
            self._relaxed(sql, params)

    def sync(self) -> None:
        """Make every commit so far durable (fsync the write-ahead log)."""
        try:
            fd = os.open(f"{self.path}-wal", os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return  # checkpointed and removed: everything is in the database file already
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def set_acked_offset(self, command_id: str, offset: int) -> None:
        self._relaxed(
            "UPDATE commands SET acked_offset = ? WHERE command_id = ?", (offset, command_id)
        )

    def mark_acked(self, command_id: str, offset: int) -> None:
        """Compact a command the server has durably: keep only what dedupe needs.

        Not fsync'd: if a power cut loses this, the row is still active and its result is
        sent again, which the server ignores.
        """
        self._relaxed(
            "UPDATE commands SET state = 'acked', body = NULL, acked_offset = ?, acked_at = ?,"
            " pid = NULL WHERE command_id = ?",
            (offset, time.time(), command_id),
        )

    def prune(self, *, older_than: float = RETENTION_SECONDS) -> int:
        cur = self._db.execute(
            "DELETE FROM commands WHERE state = 'acked' AND acked_at < ?",
            (time.time() - older_than,),
        )
        return cur.rowcount

    def delete_all(self) -> None:
        self._db.execute("DELETE FROM commands")

    def __iter__(self) -> Iterator[Entry]:
        rows = self._db.execute(f"SELECT {_COLUMNS} FROM commands ORDER BY seq").fetchall()
        return iter([_entry(r) for r in rows])
