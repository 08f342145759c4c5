"""The shared words (controlplane/domain.py) match what the database and the code expect.

The enums' values are stored in rows and sent between replicas, so a value that drifts from
the schema, or a set that drifts from the index built on it, fails here rather than in a
query that quietly matches nothing.
"""

from __future__ import annotations

import ast
import asyncio
import json
import re
from pathlib import Path

import asyncpg

from controlplane import domain
from controlplane.db.models import Base
from controlplane.db.urls import asyncpg_dsn
from controlplane.domain import (
    CLOSED_TICKET_SQL,
    CLOSED_TICKET_STATES,
    LIVE_COMMAND_SQL,
    LIVE_COMMAND_STATES,
    TERMINAL_COMMAND_SQL,
    TERMINAL_COMMAND_STATES,
    CommandState,
    EffectKind,
    Notify,
    TicketState,
    sql_list,
)

ROOT = Path(__file__).resolve().parents[3]
_QUOTED = re.compile(r"'([^']*)'")


async def _constraint(pool: asyncpg.Pool, name: str) -> list[str]:
    definition = await pool.fetchval(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = $1", name
    )
    assert definition is not None, f"no constraint {name} in the migrated database"
    return _QUOTED.findall(str(definition))


async def _index_predicate(pool: asyncpg.Pool, name: str) -> list[str]:
    definition = await pool.fetchval("SELECT indexdef FROM pg_indexes WHERE indexname = $1", name)
    assert definition is not None, f"no index {name} in the migrated database"
    return _QUOTED.findall(str(definition).partition(" WHERE ")[2])


async def test_the_states_are_those_the_migrated_schema_allows(pool: asyncpg.Pool) -> None:
    assert await _constraint(pool, "ck_tickets_state") == list(TicketState)
    assert await _constraint(pool, "ck_commands_state") == list(CommandState)


async def test_the_partial_indexes_cover_the_sets_their_queries_use(pool: asyncpg.Pool) -> None:
    # The workers' look for live tickets reads ix_tickets_live: NOT IN the closed states.
    assert await _index_predicate(pool, "ix_tickets_live") == list(CLOSED_TICKET_STATES)
    pending = await _index_predicate(pool, "ix_commands_pending")
    assert set(pending) <= set(LIVE_COMMAND_STATES)


def test_the_models_check_constraints_are_made_from_the_enums() -> None:
    checks = {
        f"{table.name}.{constraint.name}": str(getattr(constraint, "sqltext", ""))
        for table in Base.metadata.sorted_tables
        for constraint in table.constraints
    }
    assert _QUOTED.findall(checks["tickets.ck_tickets_state"]) == list(TicketState)
    assert _QUOTED.findall(checks["commands.ck_commands_state"]) == list(CommandState)


def test_the_sets_divide_the_states() -> None:
    assert set(TERMINAL_COMMAND_STATES) | set(LIVE_COMMAND_STATES) == set(CommandState)
    assert not set(TERMINAL_COMMAND_STATES) & set(LIVE_COMMAND_STATES)
    assert set(CLOSED_TICKET_STATES) < set(TicketState)
    assert CLOSED_TICKET_SQL == "'completed', 'failed', 'stopped'"
    assert TERMINAL_COMMAND_SQL == "'finished', 'failed', 'cancelled', 'expired', 'refused'"
    assert LIVE_COMMAND_SQL == "'queued', 'delivered', 'awaiting_approval', 'running'"
    assert sql_list(["it's"]) == "'it''s'"


def test_words_on_the_wire_keep_their_values() -> None:
    """Renaming one of these strands rows and notifications of a running deployment: it
    takes a migration (or a rolling-upgrade plan), not an edit of domain.py."""
    assert {kind.name: kind.value for kind in EffectKind} == {
        "REPLY": "reply",
        "ACKNOWLEDGE": "acknowledge",
        "RUN_COMMAND": "run_command",
        "OPEN_PULL_REQUEST": "open_pull_request",
    }
    assert {channel.name: channel.value for channel in Notify} == {
        "ROUTER": "superagent_router",
        "WORKERS": "superagent_workers",
        "INBOX": "superagent_inbox",
        "EFFECTS": "superagent_effects",
        "COMMANDS": "superagent_commands",
        "COMMAND_DONE": "superagent_command_done",
        "DEVICES": "superagent_devices",
        "WEBCHAT": "superagent_webchat",
    }


def test_every_effect_kind_has_a_handler_in_a_replica() -> None:
    runtime = (ROOT / "controlplane" / "runtime.py").read_text()
    registered = re.findall(r"handlers\.register\(\s*EffectKind\.(\w+)", runtime)
    assert sorted(registered) == sorted(kind.name for kind in EffectKind)


def test_a_member_is_its_value_wherever_a_string_goes() -> None:
    assert f"{TicketState.WAITING_HUMAN}" == "waiting_human"
    assert str(CommandState.AWAITING_APPROVAL) == "awaiting_approval"
    assert json.dumps({"state": TicketState.OPEN}) == '{"state": "open"}'
    assert "finished" in TERMINAL_COMMAND_STATES
    assert {"reply": 1}[EffectKind.REPLY] == 1


async def test_asyncpg_takes_members_as_text(pool: asyncpg.Pool, database_url: str) -> None:
    assert await pool.fetchval("SELECT $1::text", TicketState.OPEN) == "open"
    assert await pool.fetchval("SELECT 'queued' = ANY($1::text[])", list(LIVE_COMMAND_STATES))
    listener = await asyncpg.connect(asyncpg_dsn(database_url))
    heard: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
    try:
        await listener.add_listener(
            Notify.WORKERS, lambda _c, _p, channel, payload: heard.put_nowait((channel, payload))
        )
        await pool.execute("SELECT pg_notify($1, $2)", Notify.WORKERS, "tkt_x")
        assert await asyncio.wait_for(heard.get(), 5) == ("superagent_workers", "tkt_x")
    finally:
        await listener.close()


def test_the_vocabulary_imports_nothing_of_the_control_plane() -> None:
    imported: list[str] = []
    for node in ast.walk(ast.parse(Path(domain.__file__).read_text())):
        if isinstance(node, ast.ImportFrom):
            imported.append(node.module or "")
        elif isinstance(node, ast.Import):
            imported.extend(alias.name for alias in node.names)
    assert not [name for name in imported if name.startswith("controlplane")], imported


_NOTIFYING_CALLS = {"add_listener", "remove_listener", "execute", "fetch", "fetchval", "fetchrow"}


def _channel_copies(tree: ast.AST) -> set[str]:
    """Channel names this module spells out: inside SQL text, assigned to a name, or handed
    to LISTEN or a query. (Metric names such as ``superagent_commands`` are other words.)"""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found |= {channel.value for channel in Notify if f"'{channel}'" in node.value}
        spelled: list[ast.expr] = []
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            spelled = [node.value]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            spelled = list(node.args) if node.func.attr in _NOTIFYING_CALLS else []
        found |= {
            value.value
            for value in spelled
            if isinstance(value, ast.Constant) and value.value in set(Notify)
        }
    return found


def test_no_module_spells_a_channel_name_again() -> None:
    """A channel written out in a second place drifts: take it from Notify."""
    copies = {
        str(path.relative_to(ROOT)): found
        for path in sorted((ROOT / "controlplane").rglob("*.py"))
        if path.name != "domain.py" and "migrations" not in path.parts
        if (found := _channel_copies(ast.parse(path.read_text())))
    }
    assert not copies
