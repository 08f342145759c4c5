"""The record of every ticket workspace endpointd made: ``<state dir>/workspaces.json``.

It is what survives a daemon restart (which workspace belongs to which ticket, of which
clone, from which commit, released when) and what the sandbox trusts: the clone's git
directories a ticket's commands may write are taken from here, never from the workspace's
own ``.git`` file, which those commands can rewrite. It lives in the state dir for that
reason (denied to every command).

Written atomically; read-modify-write happens under an exclusive lock on
``workspaces.lock`` (:meth:`Store.edit`), so the daemon and ``endpointd workspaces prune``
never lose each other's changes. A file that cannot be read is set aside
(``workspaces.json.broken-<time>``) rather than taken for "no workspaces": what it listed
is then neither pruned nor granted anything.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from endpointd.fsutil import atomic_write, exclusive_lock
from endpointd.paths import ensure_private_dir

__all__ = ["RECORD_FILE", "Record", "Setup", "State", "Store"]

log = logging.getLogger(__name__)

RECORD_FILE = "workspaces.json"
LOCK_FILE = "workspaces.lock"
VERSION = 1

# creating: the worktree is being made (a crash leaves it half made; the next prepare
# starts over); active: the ticket works there; released: the ticket ended, it goes once
# the policy's retention has passed.
State = Literal["creating", "active", "released"]


@dataclass
class Setup:
    """The setup step's outcome, as the answer carries it."""

    ran: bool
    exit_code: int | None = None
    output_tail: str = ""


@dataclass
class Record:
    ticket: str
    path: str  # the workspace (or, in place, the user's directory)
    state: State = "creating"
    in_place: bool = False
    repo: str = ""  # normalised remote
    clone: str = ""  # the user's checkout it came from (top level)
    subdir: str = ""  # where in the clone the request pointed, relative
    common_dir: str = ""  # the clone's git common dir
    admin_dir: str = ""  # <common_dir>/worktrees/<name>
    remote: str = ""  # the remote's name in the clone ("origin")
    branch: str = ""
    base: str = ""  # the commit it started from
    base_kind: str = ""  # default_branch | pull_request | local_changes | existing_branch
    upstream: str = ""  # "origin/<ref>" for a pull request's workspace
    created_at: float = field(default_factory=time.time)
    released_at: float | None = None
    size_bytes: int = 0
    size_at: float = 0.0  # when size_bytes was measured (0: estimated)
    setup: Setup | None = None

    @property
    def answer_path(self) -> str:
        return os.path.join(self.path, self.subdir) if self.subdir else self.path

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Record:
        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in raw.items() if k in known}
        setup = data.get("setup")
        data["setup"] = Setup(**setup) if isinstance(setup, dict) else None
        return cls(**data)


class Store:
    """The records of one state dir."""

    def __init__(self, state_directory: Path) -> None:
        self.directory = state_directory
        self.path = state_directory / RECORD_FILE
        self._cache: tuple[tuple[int, int, int], dict[str, Record]] | None = None

    def load(self) -> dict[str, Record]:
        """The records as last written (no lock: writes are atomic)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return {}
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        if self._cache is not None and self._cache[0] == stamp:
            return {k: Record.from_json(v.to_json()) for k, v in self._cache[1].items()}
        records = self._parse(self.path.read_bytes())
        self._cache = (stamp, records)
        return {k: Record.from_json(v.to_json()) for k, v in records.items()}

    def _parse(self, data: bytes) -> dict[str, Record]:
        try:
            raw = json.loads(data)
            entries = raw["workspaces"]
            return {
                str(ticket): Record.from_json(entry)
                for ticket, entry in entries.items()
                if isinstance(entry, dict)
            }
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            aside = self.path.with_name(f"{RECORD_FILE}.broken-{int(time.time())}")
            with contextlib.suppress(OSError):
                os.replace(self.path, aside)
            log.error("%s could not be read (%s); set aside as %s", self.path, exc, aside)
            return {}

    def get(self, ticket: str) -> Record | None:
        return self.load().get(ticket)

    @contextlib.contextmanager
    def edit(self) -> Iterator[dict[str, Record]]:
        """The records, under the lock, written back when the block ends without error."""
        ensure_private_dir(self.directory)
        with exclusive_lock(self.directory / LOCK_FILE):
            records = self.load()
            yield records
            self.save(records)

    def save(self, records: dict[str, Record]) -> None:
        """Write ``records`` (callers hold the lock, see :meth:`edit`)."""
        body = {
            "version": VERSION,
            "workspaces": {k: r.to_json() for k, r in sorted(records.items())},
        }
        atomic_write(self.path, json.dumps(body, indent=1).encode(), mode=0o600)
