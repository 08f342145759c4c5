"""One owner per table: the statements that change a table live in the module that owns it,
and nowhere else, for every table of the schema.

A newcomer asking "where does a ticket change state" (or a mandate, a device, an effect)
gets one answer, and CI stops a write that sneaks in elsewhere. The tables are read from
the schema (``controlplane/db/models.py``), so a new table fails here until it is given an
owner. A table with more than one owner module names why (:data:`OWNERS`); the usual
reason is one statement that writes several tables at once, kept whole because it must be
atomic or is the hot path.

What counts as a write, and how it is found (parsed string literals, not a grep of the
text), is in :mod:`tests.repo.writes`; the migrations are the schema's history and are
left out.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

import pytest

from controlplane.db.models import Base
from tests.repo.writes import COMPUTED, writes, writes_in_source

ROOT = Path(__file__).resolve().parents[2]

TABLES = sorted(Base.metadata.tables)


class Owners(NamedTuple):
    modules: frozenset[str]  # under controlplane/
    why: str = ""  # required when there is more than one


def owner(module: str) -> Owners:
    return Owners(frozenset({module}))


def owners(why: str, *modules: str) -> Owners:
    return Owners(frozenset(modules), why)


# One statement of intake stores a trigger with everything it implies, in one round trip
# on the hot path of every event: its thread, its text's blob, the subscribed tickets'
# inbox rows and the request's acknowledgement effect.
_INTAKE = "ingest/intake.py"
_INTAKE_WHY = "intake's one statement stores a trigger with all it implies"

OWNERS: dict[str, Owners] = {
    # -- the ticket aggregate ------------------------------------------------------------
    "tickets": owner("tickets/store.py"),
    "mandates": owners(
        "forgetting a person (people.remove) unlinks them from the mandates that name "
        "them, in the same transaction; people sits below tickets, which imports it",
        "tickets/mandates.py",
        "people.py",
    ),
    "subscriptions": owner("tickets/subscriptions.py"),
    "links": owner("tickets/subscriptions.py"),
    "ticket_inbox": owners(_INTAKE_WHY, "ingest/inbox.py", _INTAKE),
    "assignments": owner("tickets/slots.py"),
    "jobs": owner("tickets/events.py"),
    "worker_events": owner("tickets/events.py"),
    "reports": owner("tickets/reports.py"),
    "approval_answers": owner("tickets/consent.py"),
    "device_approvals": owners(
        "two halves, as commands: a check records the approval it asks for (and cancels "
        "it when the ticket moves); the approvals service records the owner's answer",
        "gateway/authorization.py",
        "tickets/consent.py",
    ),
    "sessions": owner("llm/sessions.py"),
    "session_messages": owner("llm/sessions.py"),
    "effects": owners(
        "the outbox's two halves, and intake: a request's acknowledgement is queued in the "
        "statement that stores it. The outbox queues (and revives) effects; the runner "
        "claims, completes and fails them",
        "effects/outbox.py",
        "effects/runner.py",
        _INTAKE,
    ),
    # -- events in -------------------------------------------------------------------------
    "triggers": owners(
        "intake stores them; routing moves them on. And forgetting a person unlinks them "
        "from the triggers that name them (people.remove, as for mandates)",
        _INTAKE,
        "ingest/routing.py",
        "people.py",
    ),
    "threads": owner(_INTAKE),
    "channel_state": owner("channels/base.py"),
    "sent_messages": owners(
        "web chat has no server to post to: its adapter's send is the record (and its "
        "NOTIFY, in the same statement); every other channel's is recorded by the outbox",
        "channels/outbound.py",
        "channels/webchat/adapter.py",
    ),
    # -- devices and their commands ----------------------------------------------------
    "devices": owners(
        "the queue takes a device's next_seq in the statement that queues a command, so "
        "two commands never share a number",
        "gateway/devices.py",
        "gateway/queue.py",
    ),
    "commands": owners(
        "the command queue's two halves: the workers' API (queue.py) and what the "
        "gateway's streams read and record (delivery.py)",
        "gateway/queue.py",
        "gateway/delivery.py",
    ),
    "blob_chunks": owner("gateway/delivery.py"),
    "blobs": owners(
        "the store every large body spills into: a blob row is written in the statement "
        "that stores what points at it (a command and its output, a trigger and its text), "
        "or by the model client for a long answer",
        "gateway/queue.py",
        "gateway/delivery.py",
        _INTAKE,
        "llm/client.py",
    ),
    "device_repositories": owner("gateway/repositories.py"),
    "device_shares": owner("gateway/authorization.py"),
    "pairing_codes": owner("gateway/pairing.py"),
    "pairing_throttle": owner("gateway/pairing.py"),
    # -- the model, the router, the watchdog -------------------------------------------
    "llm_calls": owner("llm/client.py"),
    "router_decisions": owner("router/tools/toolbox.py"),
    "watchdog_findings": owner("findings.py"),
    "watchdog_actions": owner("findings.py"),
    # -- the replica, people, settings ---------------------------------------------------
    # Heartbeats and what each replica runs with: built from an allow-list there, so no
    # other module may put a settings dump (and its secrets) in this table.
    "replicas": owner("heartbeat.py"),
    "leases": owner("leadership.py"),
    "pause": owner("pause.py"),
    "item_failures": owner("failures.py"),
    "people": owner("people.py"),
    "accounts": owner("people.py"),
    "console_sessions": owner("access/sessions.py"),
    "api_tokens": owner("access/api_tokens.py"),
    "signin_throttle": owner("access/throttle.py"),
    "harness_runs": owner("workers/harness/runs.py"),
    "policy_versions": owner("versions.py"),
    "prompt_versions": owner("versions.py"),
}

# Writes whose table is computed at run time, which the source cannot show: the module,
# the tables it may write that way, and why.
COMPUTED_WRITES: dict[str, tuple[frozenset[str], str]] = {
    "versions.py": (
        frozenset({"policy_versions", "prompt_versions"}),
        "one writer for every kind of versioned text; the table is the kind's",
    ),
}


def _writers() -> tuple[dict[str, set[str]], set[str]]:
    """Table → the modules (under controlplane/) that write it; and the modules that write
    a table whose name is computed, not named in :data:`COMPUTED_WRITES`."""
    found: dict[str, set[str]] = {}
    unnamed = set()
    for path, tables in writes(ROOT).items():
        module = path.removeprefix("controlplane/")
        if COMPUTED in tables:
            if module not in COMPUTED_WRITES:
                unnamed.add(module)
            named = COMPUTED_WRITES.get(module, (frozenset(), ""))[0]
            tables = (tables - {COMPUTED}) | named
        for table in tables:
            found.setdefault(table, set()).add(module)
    return found, unnamed


WRITERS, UNNAMED = _writers()


def test_every_write_names_its_table() -> None:
    """A statement whose table is computed hides its table from this check: write the
    table's name in it, or name the module and the tables it may write in
    COMPUTED_WRITES."""
    assert not UNNAMED, sorted(UNNAMED)


def test_every_table_has_its_owners() -> None:
    """A new table fails here until it is given an owner; a dropped one, until its entry
    goes."""
    assert sorted(OWNERS) == TABLES


@pytest.mark.parametrize("table", TABLES)
def test_only_its_owners_write_the_table(table: str) -> None:
    others = WRITERS.get(table, set()) - OWNERS[table].modules
    assert not others, f"{table} is written outside its owners: {sorted(others)}"


@pytest.mark.parametrize("table", TABLES)
def test_every_owner_writes_the_table(table: str) -> None:
    """The list stays true: an owner that no longer writes the table is taken off it."""
    assert OWNERS[table].modules <= WRITERS.get(table, set())


@pytest.mark.parametrize("table", TABLES)
def test_several_owners_say_why(table: str) -> None:
    found = OWNERS[table]
    assert len(found.modules) == 1 or found.why, f"{table} has several owners and no reason"


def test_computed_writes_stay_named() -> None:
    for module in COMPUTED_WRITES:
        assert COMPUTED in writes_in_source((ROOT / "controlplane" / module).read_text())


# -- what the check sees --------------------------------------------------------------------


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE tickets SET state = 'running'",
        "update tickets t set hold = null",
        "UPDATE ONLY tickets SET hold = NULL",
        "UPDATE public.tickets SET hold = NULL",
        'UPDATE "tickets" SET hold = NULL',
        "INSERT INTO tickets (id) VALUES ($1)",
        "INSERT INTO tickets AS t (id) VALUES ($1)",
        "INSERT\n    INTO\ttickets (id)\n    VALUES ($1)",
        "INSERT INTO tickets (id) VALUES ($1) ON CONFLICT (id) DO UPDATE SET title = 'x'",
        "DELETE FROM tickets WHERE id = $1",
        "DELETE FROM ONLY tickets WHERE id = $1",
        "WITH gone AS (DELETE FROM tickets RETURNING id) SELECT count(*) FROM gone",
        "WITH x AS (SELECT id FROM threads) UPDATE tickets SET hold = NULL FROM x",
        "TRUNCATE tickets",
        "TRUNCATE TABLE tickets CASCADE",
        "MERGE INTO tickets t USING src s ON t.id = s.id WHEN MATCHED THEN DELETE",
        "COPY tickets FROM STDIN",
        "COPY tickets (id, title) FROM STDIN",
    ],
)
def test_the_check_sees_a_write(statement: str) -> None:
    """Every spelling of a write names its table."""
    assert "tickets" in writes_in_source(f"SQL = {statement!r}\n")


@pytest.mark.parametrize(
    "source",
    [
        # Adjacent literals are one string, however they are split across lines.
        'SQL = (\n    "INSERT INTO "\n    "tickets (id) VALUES ($1)"\n)\n',
        'sql = f"UPDATE tickets SET hold = {HOLD!r}"\n',
        'await conn.copy_records_to_table("tickets", records=rows)\n',
        "await conn.copy_to_table('tickets', source=path)\n",
    ],
)
def test_the_check_sees_a_write_in_python(source: str) -> None:
    assert "tickets" in writes_in_source(source)


@pytest.mark.parametrize(
    ("statement", "tables"),
    [
        # An upsert's DO UPDATE changes its own table, and names no other.
        (
            "INSERT INTO threads (id) VALUES ($1) ON CONFLICT (id) DO UPDATE SET url = $2",
            {"threads"},
        ),
        # One statement, several tables: each of them is written.
        (
            "WITH t AS (INSERT INTO triggers (id) VALUES ($1) RETURNING id), "
            "i AS (INSERT INTO ticket_inbox (trigger_id) SELECT id FROM t) "
            "UPDATE tickets SET hold = NULL FROM t",
            {"triggers", "ticket_inbox", "tickets"},
        ),
        ("UPDATE tickets SET hold = NULL FROM threads WHERE threads.id = $1", {"tickets"}),
    ],
)
def test_the_check_names_every_table_a_statement_writes(statement: str, tables: set[str]) -> None:
    assert writes_in_source(f"SQL = {statement!r}\n") == tables


@pytest.mark.parametrize(
    "source",
    [
        'sql = f"UPDATE {table} SET person_id = NULL"\n',
        'sql = "DELETE FROM " + table\n',
        "await conn.copy_records_to_table(table, records=rows)\n",
    ],
)
def test_a_computed_table_is_seen(source: str) -> None:
    assert COMPUTED in writes_in_source(source)


@pytest.mark.parametrize(
    "source",
    [
        'SQL = "SELECT state FROM tickets FOR UPDATE"\n',
        'SQL = "SELECT 1 FROM tickets t FOR NO KEY UPDATE OF t"\n',
        'SQL = "UPDATE tickets_archive SET x = 1"\n',
        'SQL = "COPY tickets TO STDOUT"\n',
        'SQL = "COPY (SELECT * FROM tickets) TO STDOUT"\n',
        # Prose is not a statement: docstrings, comments, a message.
        'def f():\n    """We UPDATE tickets here."""\n',
        "# DELETE FROM tickets\n",
        'message = f"update {setting} in the app\'s settings"\n',
    ],
)
def test_the_check_sees_no_write(source: str) -> None:
    assert not writes_in_source(source) - {"tickets_archive"}


@pytest.mark.parametrize(
    "source",
    [
        'SQL = "TRUNCATE tickets"\n',
        'SQL = "MERGE INTO tickets t USING s ON true WHEN MATCHED THEN DELETE"\n',
        'SQL = "COPY tickets FROM STDIN"\n',
        'SQL = "UPDATE ONLY tickets SET hold = NULL"\n',
        "SQL = 'UPDATE \"tickets\" SET hold = NULL'\n",
        'SQL = (\n    "INSERT INTO "\n    "tickets (id) VALUES ($1)"\n)\n',
        'await conn.copy_records_to_table("tickets", records=rows)\n',
    ],
)
def test_the_old_check_missed_these(source: str) -> None:
    """Writes the regular expression this check replaced (run over a file's text) did not
    see, and this one does."""
    old = re.compile(r"\b(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+tickets\b", re.IGNORECASE)
    assert not old.search(source)
    assert "tickets" in writes_in_source(source)
