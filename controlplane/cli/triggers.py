"""``superagent triggers``: the router's inbox, and the events it set aside as undecidable."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import asyncpg
import click

from controlplane.cli.common import json_option, load_settings, outcome, setup_logging
from controlplane.cli.dbsession import run_with_pool
from controlplane.errors import InvalidInput, NotFound
from controlplane.ingest import routing
from controlplane.router import record
from superagent_shared import table
from superagent_shared.ids import id_prefix

_COLUMNS = (
    "t.id, t.source, t.thread_id, th.external_id AS thread, t.actor_name, t.kind, t.verdict, "
    "t.route, t.text, t.created_at, t.routed_at, t.undecidable_at, t.route_attempts, "
    "t.route_error, t.model_notice_at"
)


@click.group()
def triggers() -> None:
    """See the router's inbox, and put back events it set aside as undecidable.

    An event the router's turns kept failing on (a malformed model answer, an error in
    the control plane) is tried alone, then, after router.quarantine_after failed turns,
    set aside as undecidable with its reason; the admin channel is told. Fix the cause
    (a prompt, a model, a bug), then retry it: the next router turn decides it.

    \b
    Examples:
      superagent triggers list
      superagent triggers list --undecidable --json
      superagent triggers show trg_8f3k2q4m9x1a
      superagent triggers retry trg_8f3k2q4m9x1a
    """


def _state(row: asyncpg.Record) -> str:
    if row["undecidable_at"] is not None:
        return "undecidable"
    if row["routed_at"] is None:
        return "waiting" if row["route_attempts"] == 0 else f"failing ({row['route_attempts']})"
    return "routed"


def _as_json(row: asyncpg.Record) -> dict[str, Any]:
    out: dict[str, Any] = {"state": _state(row)}
    for key, value in dict(row).items():
        out[key] = value.isoformat() if isinstance(value, datetime) else value
    return out


def _checked(trigger_id: str) -> str:
    if id_prefix(trigger_id) != "trg":
        raise InvalidInput(f"{trigger_id!r} is not a trigger id (trg_ and 12 characters)")
    return trigger_id


async def _one(pool: asyncpg.Pool, trigger_id: str) -> asyncpg.Record:
    row = await pool.fetchrow(
        f"SELECT {_COLUMNS} FROM triggers t JOIN threads th ON th.id = t.thread_id WHERE t.id = $1",
        _checked(trigger_id),
    )
    if row is None:
        raise NotFound(f"no trigger {trigger_id}")
    return row


@triggers.command(name="list")
@click.option("--undecidable", is_flag=True, help="Only events set aside as undecidable.")
@click.option("--limit", default=50, show_default=True, help="At most this many.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_(undecidable: bool, limit: int, as_json: bool) -> None:
    """Events waiting for the router and those set aside as undecidable, oldest first."""
    setup_logging("WARNING")
    where = (
        "t.undecidable_at IS NOT NULL"
        if undecidable
        else "(t.routed_at IS NULL OR t.undecidable_at IS NOT NULL)"
    )

    async def work(pool: asyncpg.Pool) -> list[asyncpg.Record]:
        return list(
            await pool.fetch(
                f"SELECT {_COLUMNS} FROM triggers t JOIN threads th ON th.id = t.thread_id "
                f"WHERE {where} ORDER BY t.created_at, t.id LIMIT $1",
                max(limit, 0),
            )
        )

    found = run_with_pool(load_settings(), work)
    if as_json:
        click.echo(json.dumps([_as_json(row) for row in found], indent=2))
        return
    if not found:
        click.echo(
            "No undecidable events."
            if undecidable
            else "Nothing waits for the router, and nothing is undecidable."
        )
        return
    rows = [
        (
            row["id"],
            _state(row),
            f"{row['source']}:{row['thread']}",
            f"{row['created_at']:%Y-%m-%d %H:%M}",
            row["actor_name"],
            row["route_error"] or "",
        )
        for row in found
    ]
    header = ("TRIGGER", "STATE", "THREAD", "AT (UTC)", "FROM", "WHY")
    for line in table.render(header, rows):
        click.echo(line)


@triggers.command()
@click.argument("trigger")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def show(trigger: str, as_json: bool) -> None:
    """One TRIGGER: its thread, text, state, what the router decided, the calls its turns
    made (refused ones with why), failed turns and their reasons."""
    setup_logging("WARNING")

    async def work(
        pool: asyncpg.Pool,
    ) -> tuple[asyncpg.Record, list[asyncpg.Record], list[dict[str, Any]]]:
        row = await _one(pool, trigger)
        failed = await pool.fetch(
            "SELECT error_class, error, quarantined, created_at FROM item_failures "
            "WHERE loop = 'router' AND item_id = $1 ORDER BY created_at, id",
            trigger,
        )
        return row, list(failed), await record.calls(pool, trigger)

    row, failed, calls = run_with_pool(load_settings(), work)
    if as_json:
        out = _as_json(row)
        out["failures"] = [_as_json(f) for f in failed]
        out["decision"] = record.decision(calls)
        out["calls"] = [
            {k: v.isoformat() if isinstance(v, datetime) else v for k, v in c.items()}
            for c in calls
        ]
        click.echo(json.dumps(out, indent=2, default=str))
        return
    click.echo(f"{row['id']}: {row['verdict']} {row['kind']} from {row['actor_name']}")
    click.echo(f"  thread:   {row['thread_id']} ({row['source']}:{row['thread']})")
    click.echo(f"  state:    {_state(row)}; route {row['route']}")
    click.echo(f"  at:       {row['created_at']:%Y-%m-%d %H:%M:%S} UTC")
    if row["route_attempts"]:
        click.echo(f"  failed turns: {row['route_attempts']}, last: {row['route_error']}")
    if row["model_notice_at"] is not None:
        click.echo(f"  told the model was unreachable: {row['model_notice_at']:%Y-%m-%d %H:%M}")
    for failure in failed:
        mark = " (set aside)" if failure["quarantined"] else ""
        click.echo(f"  failure {failure['created_at']:%Y-%m-%d %H:%M:%S}: {failure['error']}{mark}")
    click.echo(f"  decision: {record.decision(calls)}")
    for call in calls:
        said = "ok      " if call["ok"] else "refused "
        arguments = json.dumps(call["arguments"], ensure_ascii=False, default=str)
        arguments = arguments if len(arguments) <= 200 else arguments[:199] + "…"
        click.echo(
            f"  call {call['created_at']:%H:%M:%S} {said}{call['tool']} {arguments}: "
            f"{call['outcome']}"
        )
    text = " ".join(str(row["text"]).split())
    click.echo(f"  text:     {text[:500]}{' …' if len(text) > 500 else ''}")
    if row["undecidable_at"] is not None:
        click.echo(f"Once the cause is fixed: superagent triggers retry {row['id']}")


@triggers.command()
@click.argument("trigger")
@json_option
def retry(trigger: str, as_json: bool) -> None:
    """Put the undecidable TRIGGER back in the router's inbox, its failures forgotten."""
    setup_logging("WARNING")

    async def work(pool: asyncpg.Pool) -> None:
        async with pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                "SELECT undecidable_at FROM triggers WHERE id = $1 FOR UPDATE",
                _checked(trigger),
            )
            if row is None:
                raise NotFound(f"no trigger {trigger}")
            if row["undecidable_at"] is None:
                raise InvalidInput(f"{trigger} is not undecidable; only those are retried")
            await routing.put_back(conn, trigger)

    run_with_pool(load_settings(), work)
    outcome(
        as_json,
        {"trigger": trigger, "retried": True},
        f"{trigger} is back in the router's inbox; the next turn decides it",
    )
