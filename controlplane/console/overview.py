"""The Overview: what needs a person first, then how the deployment is doing.

Needs attention, in this order: questions (tickets waiting for people), reviews (pull
requests waiting in ``ready``, commands a device holds for approval), failures (failed
tickets of the last week, replies or actions the outbox gave up on), requests not acted
on (explicit requests the router keeps failing on, waits on for long, or set aside) and
model calls that failed in the last day, the watchdog's open findings, and what was set
aside after failing (events the router could not decide, tickets blocked by rounds that
kept failing). When all of these are empty the page says so in one line; never while a
request waits unanswered or a model call failed.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import asyncpg

from controlplane import __version__
from controlplane.console import commands
from controlplane.deployment import Deployment, ago, leader_line
from controlplane.deployment import read as read_deployment
from controlplane.domain import TicketState
from controlplane.findings import open_findings
from controlplane.settings import Settings

LIMIT = 50
FAILED_WITHIN = "7 days"
CALLS_WITHIN = "24 hours"  # failed model calls counted on the overview
WAITING_LONG = "5 minutes"  # an explicit request undecided this long is unanswered

# Explicit requests (someone allowlisted asked) the router has not acted on: failing, set
# aside, or waiting for long (a turn takes seconds; a model outage is the usual cause).
_UNANSWERED = f"""
SELECT g.id, g.source, th.external_id AS thread, g.actor_name, g.created_at,
       g.route_attempts, g.route_error, g.undecidable_at, left(g.text, 200) AS text
FROM triggers g JOIN threads th ON th.id = g.thread_id
WHERE g.verdict = 'explicit' AND g.created_at > now() - interval '{FAILED_WITHIN}'
  AND (g.undecidable_at IS NOT NULL
       OR (g.routed_at IS NULL
           AND (g.route_attempts > 0 OR g.created_at < now() - interval '{WAITING_LONG}')))
ORDER BY g.created_at, g.id
LIMIT {LIMIT}
"""

# Model calls of the last day that failed, by outcome, with the latest error; and all calls.
_FAILED_CALLS = f"""
SELECT outcome, count(*) AS calls, max(created_at) AS last_at,
       (array_agg(left(error, 300) ORDER BY created_at DESC))[1] AS last_error
FROM llm_calls
WHERE created_at > now() - interval '{CALLS_WITHIN}' AND outcome <> 'ok'
GROUP BY outcome ORDER BY count(*) DESC, outcome
"""

_WAITING = f"""
SELECT t.id, t.title, t.state, t.hold, t.pr_url, t.updated_at, d.name AS device,
       r.question, r.summary
FROM tickets t LEFT JOIN devices d ON d.id = t.device_id
LEFT JOIN LATERAL (
    SELECT question, summary FROM reports WHERE ticket_id = t.id
    ORDER BY created_at DESC LIMIT 1
) r ON true
WHERE t.state IN ('waiting_human', 'ready')
   OR (t.state = 'failed' AND t.updated_at > now() - interval '{FAILED_WITHIN}')
ORDER BY t.updated_at
LIMIT {LIMIT * 3}
"""


def model_note(settings: Settings) -> dict[str, Any]:
    if not settings.model_configured:
        return {
            "configured": False,
            "text": "No model is set: the agent runs in rules-only mode. Set OPENAI_BASE_URL "
            "and OPENAI_API_KEY to enable the router and workers.",
        }
    # Only the host: a URL may carry credentials in its user-info part.
    host = urlsplit(settings.openai_base_url or "https://api.openai.com").hostname
    return {
        "configured": True,
        "text": f"Model endpoint: {host or 'unknown'} (router {settings.llm.router_model}, "
        f"workers {settings.llm.worker_model}).",
    }


def _status(status: Deployment) -> dict[str, Any]:
    paused = None
    if status.paused_at is not None:
        paused = {
            "at": status.paused_at,
            "ago": ago(status.paused_at),
            "by": status.paused_by,
            "reason": status.paused_reason,
        }
    return {
        "leader": leader_line(status),
        "paused": paused,
        "router_inbox": status.router_inbox,
        "tickets_active": status.tickets_active,
        "workers_running": status.workers_running,
        "tickets_waiting_device": status.tickets_waiting_device,
        "devices_online": status.devices_online,
        "devices_paired": status.devices_paired,
    }


def _request_state(row: asyncpg.Record) -> str:
    if row["undecidable_at"] is not None:
        return "set aside (told it could not be acted on)"
    if row["route_attempts"]:
        return f"failing ({row['route_attempts']} failed turns)"
    return "waiting for the router"


async def overview(settings: Settings, pool: asyncpg.Pool, channels: list[str]) -> dict[str, Any]:
    model = settings.llm.router_model if settings.model_configured else "rules-only"
    # One connection, one query after another: the pool also serves the hot paths.
    async with pool.acquire() as conn:
        current = await read_deployment(conn, model)
        waiting = await conn.fetch(_WAITING)
        approvals = await commands.awaiting_approval(conn, limit=LIMIT)
        dead = await conn.fetch(
            "SELECT id, kind, key, attempts, last_error, dead_at FROM effects "
            "WHERE dead_at IS NOT NULL ORDER BY dead_at DESC LIMIT $1",
            LIMIT,
        )
        findings = await open_findings(conn)
        unanswered = await conn.fetch(_UNANSWERED)
        failed_calls = await conn.fetch(_FAILED_CALLS)
        calls = await conn.fetchval(
            f"SELECT count(*) FROM llm_calls WHERE created_at > now() - interval '{CALLS_WITHIN}'"
        )
    tickets = [dict(row) for row in waiting]
    attention = {
        "questions": [
            t for t in tickets if t["state"] == TicketState.WAITING_HUMAN and t["hold"] != "failed"
        ],
        "reviews": [t for t in tickets if t["state"] == TicketState.READY],
        "approvals": approvals,
        "failed_tickets": [
            t for t in tickets if t["state"] == TicketState.FAILED or t["hold"] == "failed"
        ],
        "dead_effects": [dict(row) for row in dead],
        "unanswered": [{**dict(row), "state": _request_state(row)} for row in unanswered],
        "failed_calls": [dict(row) for row in failed_calls],
        "findings": [{**dict(row), "actions": list(row["actions"])} for row in findings],
        # Set aside after failing, with the command that puts each back (dead effects are
        # listed under failures already).
        "quarantined": [
            {
                "kind": item.kind,
                "id": item.id,
                "reason": item.reason,
                "since": item.since,
                "release": item.release,
            }
            for item in current.quarantined
            if item.kind != "effect"
        ],
    }
    return {
        "version": __version__,
        "model": model_note(settings),
        "channels": channels,
        "chat": settings.webchat.enabled,
        "status": {**_status(current), "model_calls": calls, "calls_within": CALLS_WITHIN},
        "attention": attention,
        "quiet": not any(attention.values()) and current.paused_at is None,
    }
