"""The watchdog's checks: each looks at recorded state and says what it sees.

A check returns :class:`~controlplane.findings.Seen` items for one kind; the
service records them (opening, bumping or resolving findings) and then decides on actions
from how long each has been seen and what was already done (``service.py``).
"""

from __future__ import annotations

from datetime import timedelta

import asyncpg

from controlplane.domain import TERMINAL_COMMAND_STATES
from controlplane.findings import Seen
from controlplane.llm.transcript import canonical_call, message_content
from controlplane.settings import Settings

LOOP_WINDOW = 6  # tool calls looked at for a loop
LOOP_DISTINCT = 2  # at most this many different calls among them: looping


async def replicas(pool: asyncpg.Pool, settings: Settings) -> list[Seen]:
    silence = timedelta(seconds=settings.watchdog.replica_silence_seconds)
    rows = await pool.fetch(
        "SELECT id, hostname, heartbeat_at FROM replicas WHERE stopped_at IS NULL "
        "AND heartbeat_at < now() - $1::interval AND heartbeat_at > now() - interval '1 day'",
        silence,
    )
    seen = [
        Seen(
            "replica_silent",
            row["id"],
            "warning",
            f"replica {row['id']} on {row['hostname']} has been silent since "
            f"{row['heartbeat_at']:%Y-%m-%d %H:%M:%S} UTC (killed, or cut off from Postgres)",
        )
        for row in rows
    ]
    alive = await pool.fetchval(
        "SELECT count(*) FROM replicas WHERE stopped_at IS NULL "
        "AND heartbeat_at >= now() - $1::interval",
        silence,
    )
    known = await pool.fetchval("SELECT count(*) FROM replicas")
    if known and not alive:
        seen.append(
            Seen(
                "no_replica",
                "control-plane",
                "critical",
                "no control-plane replica is running: nothing is routed, executed or answered",
            )
        )
    return seen


async def leases(pool: asyncpg.Pool, settings: Settings) -> list[Seen]:
    seen = []
    router = await pool.fetchrow(
        "SELECT holder, expires_at FROM leases WHERE name = 'router' "
        "AND expires_at < now() - $1::interval",
        timedelta(seconds=settings.router.lease_seconds * 2),
    )
    if router is not None:
        seen.append(
            Seen(
                "router_leaderless",
                "router",
                "critical",
                f"the router has had no leader since {router['expires_at']:%H:%M:%S} UTC "
                f"(last: {router['holder']}); requests wait in its inbox",
            )
        )
    rows = await pool.fetch(
        "SELECT a.id, a.ticket_id, a.lease_owner, a.lease_expires_at FROM assignments a "
        "WHERE a.ended_at IS NULL AND a.lease_expires_at < now() - $1::interval",
        timedelta(seconds=settings.workers.lease_seconds * 2),
    )
    seen += [
        Seen(
            "lease_expired",
            row["ticket_id"],
            "warning",
            f"{row['ticket_id']}'s worker lease ran out at {row['lease_expires_at']:%H:%M:%S} "
            f"UTC (held by {row['lease_owner']}) and no replica has taken it over",
            {"assignment": row["id"]},
        )
        for row in rows
    ]
    return seen


async def errors(pool: asyncpg.Pool, settings: Settings) -> list[Seen]:
    """Model calls failing in a row (per kind of session), and outbox effects that keep
    failing against an outside API."""
    seen = []
    streak = max(settings.watchdog.error_streak, settings.watchdog.pause_after_errors)
    for kind in ("router", "worker"):
        rows = await pool.fetch(
            "SELECT c.error, c.created_at FROM llm_calls c JOIN sessions s ON s.id = c.session_id "
            "WHERE s.kind = $1 ORDER BY c.created_at DESC LIMIT $2",
            kind,
            streak,
        )
        failed = 0
        for row in rows:
            if row["error"] is None:
                break
            failed += 1
        if failed >= settings.watchdog.error_streak:
            seen.append(
                Seen(
                    "llm_errors",
                    kind,
                    "critical",
                    f"the last {failed} {kind} model calls failed; the latest: "
                    f"{rows[0]['error'][:300]}",
                    {"streak": failed},
                )
            )
    for row in await pool.fetch(
        "SELECT kind, count(*) AS n, max(attempts) AS attempts, "
        "(array_agg(last_error ORDER BY next_attempt_at DESC))[1] AS error, "
        "count(*) FILTER (WHERE dead_at IS NOT NULL) AS dead "
        "FROM effects WHERE (attempts >= 3 AND dead_at IS NULL) "
        "   OR dead_at > now() - interval '1 hour' GROUP BY kind"
    ):
        seen.append(
            Seen(
                "effects_failing",
                row["kind"],
                "warning",
                f"{row['n']} {row['kind']} action(s) keep failing ({row['dead']} given up, "
                f"up to {row['attempts']} attempts); the latest error: "
                f"{(row['error'] or '')[:300]}",
            )
        )
    return seen


async def device_queues(pool: asyncpg.Pool, settings: Settings) -> list[Seen]:
    rows = await pool.fetch(
        "SELECT d.id, d.name, count(*) AS n, min(c.not_after) AS oldest FROM commands c "
        "JOIN devices d ON d.id = c.device_id WHERE c.state = 'queued' AND c.not_after < now() "
        "GROUP BY d.id, d.name"
    )
    return [
        Seen(
            "queue_expired",
            row["id"],
            "warning",
            f"{row['n']} command(s) for {row['name']} passed their expiry without being "
            f"delivered (the oldest at {row['oldest']:%Y-%m-%d %H:%M} UTC)",
            {"device": row["name"]},
        )
        for row in rows
    ]


async def workers(pool: asyncpg.Pool, settings: Settings) -> list[Seen]:
    """Running rounds with no progress (no message, no finished command) for a while and
    no job still running, and rounds whose recent tool calls go round in circles."""
    stall = timedelta(seconds=settings.watchdog.stall_seconds)
    rows = await pool.fetch(
        """
        SELECT a.id, a.ticket_id, a.session_id, greatest(a.created_at,
               (SELECT max(m.created_at) FROM session_messages m WHERE m.session_id = a.session_id),
               (SELECT max(c.finished_at) FROM commands c WHERE c.ticket_id = a.ticket_id)
               ) AS active_at,
               EXISTS (SELECT 1 FROM jobs j JOIN commands c ON c.id = j.command_id
                       WHERE j.ticket_id = a.ticket_id AND c.state <> ALL($1::text[])) AS busy
        FROM assignments a JOIN tickets t ON t.id = a.ticket_id
        WHERE a.ended_at IS NULL AND t.state = 'running'
        """,
        list(TERMINAL_COMMAND_STATES),
    )
    seen = []
    now = await pool.fetchval("SELECT now()")
    for row in rows:
        idle = now - row["active_at"]
        if idle >= stall and not row["busy"]:
            seen.append(
                Seen(
                    "stalled",
                    row["ticket_id"],
                    "warning",
                    f"{row['ticket_id']} has made no progress for {idle.total_seconds() / 60:.0f} "
                    "minutes",
                    {"idle_minutes": idle.total_seconds() / 60, "assignment": row["id"]},
                )
            )
        if row["session_id"] is None:
            continue
        calls = await _recent_calls(pool, row["session_id"])
        if len(calls) >= LOOP_WINDOW and len(set(calls)) <= LOOP_DISTINCT:
            names = sorted({c.split(":", 1)[0] for c in calls})
            seen.append(
                Seen(
                    "looping",
                    row["ticket_id"],
                    "warning",
                    f"{row['ticket_id']}'s last {len(calls)} tool calls repeat "
                    f"{len(set(calls))} call(s) ({', '.join(names)}): it looks stuck in a loop",
                    {"assignment": row["id"]},
                )
            )
    return seen


async def _recent_calls(pool: asyncpg.Pool, session_id: str) -> list[str]:
    rows = await pool.fetch(
        "SELECT content FROM session_messages WHERE session_id = $1 AND role = 'assistant' "
        "ORDER BY seq DESC LIMIT $2",
        session_id,
        LOOP_WINDOW,
    )
    calls: list[str] = []
    for row in rows:
        message = message_content(row["content"])["message"]
        for call in message.get("tool_calls") or []:
            calls.append(canonical_call(call))
    return calls[:LOOP_WINDOW]
