"""One writer per table: the statements that change ``tickets``, ``triggers`` and
``commands`` live in the modules that own those tables, and nowhere else.

A newcomer asking "where does a ticket change state" gets one answer
(``controlplane/tickets/store.py``), and CI stops a write that sneaks in elsewhere. The
command queue owns ``commands`` in its two halves: ``gateway/queue.py``, the workers' API,
and ``gateway/delivery.py``, what the gateway's streams read and record. The check reads
the source for SQL that writes each table (INSERT, UPDATE, DELETE, with or without an
alias); migrations are the schema's history and are left out.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "controlplane"

OWNERS = {
    "tickets": {"controlplane/tickets/store.py"},
    "triggers": {
        "controlplane/ingest/intake.py",
        "controlplane/ingest/inbox.py",
        "controlplane/ingest/routing.py",
    },
    "commands": {"controlplane/gateway/queue.py", "controlplane/gateway/delivery.py"},
    # What devices report (RepositoryReport), replaced as a whole per device.
    "device_repositories": {"controlplane/gateway/repositories.py"},
    # Heartbeats and what each replica runs with: built from an allow-list there, so no
    # other module may put a settings dump (and its secrets) in this table.
    "replicas": {"controlplane/heartbeat.py"},
}


def _writes(table: str) -> re.Pattern[str]:
    return re.compile(rf"\b(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+{table}\b", re.IGNORECASE)


def _writers(table: str) -> set[str]:
    pattern = _writes(table)
    found = set()
    for path in SOURCE.rglob("*.py"):
        relative = path.relative_to(ROOT).as_posix()
        if "/migrations/" in relative:
            continue
        if pattern.search(path.read_text()):
            found.add(relative)
    return found


@pytest.mark.parametrize("table", sorted(OWNERS))
def test_only_its_owner_writes_the_table(table: str) -> None:
    assert _writers(table) <= OWNERS[table], sorted(_writers(table) - OWNERS[table])


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE tickets SET state = 'running'",
        "update tickets t set hold = null",
        "INSERT INTO tickets (id) VALUES ($1)",
        "DELETE FROM tickets WHERE id = $1",
    ],
)
def test_the_check_sees_a_write(statement: str) -> None:
    """The pattern is what the check stands on: every spelling of a write must match it,
    and reads and other tables must not."""
    assert _writes("tickets").search(statement)
    for other in ("SELECT state FROM tickets", "UPDATE tickets_archive SET x = 1"):
        assert not _writes("tickets").search(other)
