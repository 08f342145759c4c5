"""The only module that writes the ``tickets`` table: every change of a ticket, by name.

Callers hold the transaction; each function is one statement in it. A function that
changes state only from given states says so, and returns whether it did (None or False:
the ticket had moved on, which the caller handles). Reading a ticket is anyone's business;
writing one goes through here, so "where does a ticket change state" has one answer.

However a ticket ends (completed, stopped, failed), the workers' housekeeping tells its
device to release its workspace (:func:`controlplane.workers.workspace.release_ended`),
from the closed state itself, so no way of ending can forget it.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from decimal import Decimal

import asyncpg

from controlplane.db.pool import Conn, Db
from controlplane.domain import TicketState, sql_list
from controlplane.tickets import pr_events

# -- made, and what it works on -----------------------------------------------------------


async def create(
    conn: Conn,
    ticket_id: str,
    *,
    title: str,
    device_id: str | None,
    repo: str | None,
    workdir: str | None,
    speculative: bool,
    workspace_base: str | None = None,
    harness: str | None = None,
) -> None:
    """A new ticket, ``open``: a worker picks it up. ``workspace_base``: where its
    workspace starts when not from the default branch (``local_changes``); ``harness``:
    who works it when a person asked (None: chosen at its first round)."""
    await conn.execute(
        "INSERT INTO tickets (id, title, device_id, repo, workdir, speculative, "
        "workspace_base, harness) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        ticket_id,
        title,
        device_id,
        repo,
        workdir,
        speculative,
        workspace_base,
        harness,
    )


async def choose_harness(conn: Db, ticket_id: str, harness: str) -> None:
    """Who works the ticket, recorded the first time it is chosen (and kept after)."""
    await conn.execute(
        "UPDATE tickets SET harness = $2 WHERE id = $1 AND harness IS NULL", ticket_id, harness
    )


async def set_repo_branch(conn: Db, ticket_id: str, repo: str | None, branch: str) -> None:
    await conn.execute(
        "UPDATE tickets SET repo = $2, branch = $3 WHERE id = $1", ticket_id, repo, branch
    )


async def set_workspace(
    conn: Db, ticket_id: str, path: str, branch: str, *, in_place: bool
) -> None:
    """The ticket's workspace as its device prepared it (its branch, when it has one)."""
    await conn.execute(
        "UPDATE tickets SET workspace = $2, branch = coalesce(nullif($3, ''), branch), "
        "workspace_base = CASE WHEN $4 THEN 'in_place' ELSE workspace_base END, "
        "updated_at = now() WHERE id = $1",
        ticket_id,
        path,
        branch,
        in_place,
    )


async def workspace_released(conn: Db, ticket_id: str) -> None:
    """The ticket's device was told it ended (it removes the workspace after retention)."""
    await conn.execute("UPDATE tickets SET workspace_released_at = now() WHERE id = $1", ticket_id)


async def record_pull_request(conn: Conn, ticket_id: str, url: str) -> None:
    await conn.execute(
        "UPDATE tickets SET pr_url = $2, updated_at = now() WHERE id = $1", ticket_id, url
    )


async def add_usage(conn: Conn, ticket_id: str, tokens: int, dollars: Decimal) -> None:
    """One model call's tokens and cost on the ticket's totals."""
    await conn.execute(
        "UPDATE tickets SET tokens_used = tokens_used + $2, "
        "cost_usd = cost_usd + $3, updated_at = now() WHERE id = $1",
        ticket_id,
        tokens,
        dollars,
    )


async def confirm_speculative(conn: Conn, ticket_id: str) -> None:
    """A speculative ticket proved its case: from now on it is ordinary."""
    await conn.execute(
        "UPDATE tickets SET speculative = false, updated_at = now() WHERE id = $1", ticket_id
    )


# -- its device ---------------------------------------------------------------------------


async def assign_device(
    conn: Conn, ticket_id: str, device_id: str, grant: str, *, waiting_for: str | None = None
) -> None:
    """The ticket's device and the grant that allows it (JSON text). ``waiting_for``: the
    grant is pending, and the ticket waits in ``waiting_human`` with that hold."""
    if waiting_for is None:
        await conn.execute(
            "UPDATE tickets SET device_id = $2, device_grant = $3::text::jsonb, "
            "updated_at = now() WHERE id = $1",
            ticket_id,
            device_id,
            grant,
        )
        return
    await conn.execute(
        "UPDATE tickets SET device_id = $2, device_grant = $3::text::jsonb, "
        "state = 'waiting_human', hold = $4, wait_until = NULL, updated_at = now() "
        "WHERE id = $1",
        ticket_id,
        device_id,
        grant,
        waiting_for,
    )


async def device_approved(
    conn: Conn,
    ticket_id: str,
    device_id: str,
    grant: str,
    *,
    resume: str,
    device_wait: timedelta,
    hold: str,
    approval_id: str,
) -> bool:
    """The owner approved the device the ticket waits for (``hold``, under approval
    ``approval_id``): it resumes in ``resume``. False if it no longer waits for that."""
    moved = await conn.fetchval(
        "UPDATE tickets SET device_id = $2, device_grant = $3::text::jsonb, "
        "state = $4::text, "
        "hold = CASE WHEN $4::text = 'waiting_device' THEN 'device' END, "
        "wait_until = CASE WHEN $4::text = 'waiting_device' "
        "THEN now() + $5::interval END, "
        "updated_at = now() "
        "WHERE id = $1 AND state = 'waiting_human' AND hold = $6 "
        "AND device_grant->>'approval' = $7 RETURNING id",
        ticket_id,
        device_id,
        grant,
        resume,
        device_wait,
        hold,
        approval_id,
    )
    return moved is not None


async def wait_for_device(
    conn: Conn, ticket_id: str, wait: timedelta, *, if_running: bool = False
) -> datetime | None:
    """Wait up to ``wait`` in ``waiting_device``; returns the wait's end, or None when
    ``if_running`` and the ticket was not running."""
    until = await conn.fetchval(
        "UPDATE tickets SET state = 'waiting_device', hold = 'device', "
        "wait_until = now() + $2::interval, updated_at = now() "
        "WHERE id = $1 AND (NOT $3::boolean OR state = 'running') RETURNING wait_until",
        ticket_id,
        wait,
        if_running,
    )
    assert until is None or isinstance(until, datetime)
    return until


async def expire_device_waits(conn: Conn) -> list[asyncpg.Record]:
    """Tickets whose device stayed away past their wait: they wait for people now
    (hold ``device_expired``). Rows: id, device (its name), wait_until."""
    rows: list[asyncpg.Record] = await conn.fetch(
        "UPDATE tickets t SET state = 'waiting_human', hold = 'device_expired', "
        "updated_at = now() FROM devices d "
        "WHERE t.state = 'waiting_device' AND t.wait_until < now() AND d.id = t.device_id "
        "RETURNING t.id, d.name AS device, t.wait_until"
    )
    return rows


# -- rounds -------------------------------------------------------------------------------


async def start_round(conn: Conn, ticket_id: str, states: Iterable[str]) -> bool:
    """``running``, if it is in one of ``states`` and no round holds it."""
    moved = await conn.fetchval(
        "UPDATE tickets SET state = 'running', hold = NULL, wait_until = NULL, "
        "retry_at = NULL, updated_at = now() WHERE id = $1 AND state = ANY($2::text[]) "
        "AND NOT EXISTS (SELECT 1 FROM assignments WHERE ticket_id = $1 AND ended_at IS NULL) "
        "RETURNING id",
        ticket_id,
        list(states),
    )
    return moved is not None


async def fresh_tries(conn: Conn, ticket_id: str) -> None:
    """The failures in a row start over: the model answered, or people stepped in."""
    await conn.execute(
        "UPDATE tickets SET failed_rounds = 0, retry_at = NULL "
        "WHERE id = $1 AND (failed_rounds > 0 OR retry_at IS NOT NULL)",
        ticket_id,
    )


async def count_failed_round(conn: Conn, ticket_id: str, reason: str) -> asyncpg.Record | None:
    """One more failed round of a running ticket; (failed_rounds, title), or None if it
    was not running."""
    row: asyncpg.Record | None = await conn.fetchrow(
        "UPDATE tickets SET failed_rounds = failed_rounds + 1, last_error = $2, "
        "updated_at = now() WHERE id = $1 AND state = 'running' "
        "RETURNING failed_rounds, title",
        ticket_id,
        reason,
    )
    return row


async def retry_later(conn: Conn, ticket_id: str, hold: str, wait: timedelta) -> None:
    """Back to ``open`` with ``hold``; no worker takes it before ``wait`` has passed."""
    await conn.execute(
        "UPDATE tickets SET state = 'open', hold = $2, retry_at = now() + $3::interval "
        "WHERE id = $1",
        ticket_id,
        hold,
        wait,
    )


async def retry_now(conn: Conn, ticket_id: str, hold: str) -> bool:
    """A ticket waiting out a retry backoff (``hold``) is retried now; False if it was not."""
    moved = await conn.fetchval(
        "UPDATE tickets SET retry_at = now() WHERE id = $1 AND hold = $2 RETURNING id",
        ticket_id,
        hold,
    )
    return moved is not None


# -- waiting for people, and ends ---------------------------------------------------------


async def wait_for_people(conn: Conn, ticket_id: str, hold: str) -> bool:
    """A running ticket waits in ``waiting_human`` (``hold``); False if it was not running."""
    moved = await conn.fetchval(
        "UPDATE tickets SET state = 'waiting_human', hold = $2, updated_at = now() "
        "WHERE id = $1 AND state = 'running' RETURNING id",
        ticket_id,
        hold,
    )
    return moved is not None


async def set_hold(conn: Conn, ticket_id: str, hold: str) -> None:
    await conn.execute("UPDATE tickets SET hold = $2 WHERE id = $1", ticket_id, hold)


async def note_untrusted(
    conn: Conn, ticket_id: str, trigger_id: str | None, *, public: bool, start_over: bool
) -> None:
    """The latest input without authority (None: none since the last with authority);
    ``untrusted_public`` accumulates unless ``start_over``."""
    await conn.execute(
        "UPDATE tickets SET untrusted_trigger_id = $2, "
        "untrusted_public = ($4::boolean AND untrusted_public) OR $3::boolean WHERE id = $1",
        ticket_id,
        trigger_id,
        public,
        not start_over,
    )


async def finish(
    conn: Conn, ticket_id: str, state: TicketState, hold: str | None, pr_url: str | None
) -> None:
    """The worker's final report decided ``state``; a pull request it opened is kept."""
    await conn.execute(
        "UPDATE tickets SET state = $2, hold = $3, pr_url = coalesce(pr_url, $4), "
        "updated_at = now() WHERE id = $1",
        ticket_id,
        state,
        hold,
        pr_url,
    )


async def stop(conn: Conn, ticket_id: str, hold: str) -> None:
    """``stopped`` for good, with why in ``hold`` (cut to the column's 50 characters)."""
    await conn.execute(
        "UPDATE tickets SET state = 'stopped', hold = $2, updated_at = now() WHERE id = $1",
        ticket_id,
        hold[:50],
    )


# A closed pull request ends its ticket (its events are its last), unless a round runs (the
# next pass ends it): merged, the ticket is completed; closed without a merge, stopped, as
# people turned the work down. A close recorded before the adapter said which (no verdict
# in its text, pr_events) completes, as it always did. The latest close decides (what the
# inbox still holds is then read: controlplane.tickets.pr_rounds.end_closed). The state is
# checked again in the update itself, so a round that started meanwhile is not overwritten.
_ENDS = sql_list(("ready", "waiting_human", "waiting_device", "open"))
_CLOSED_PULL_REQUESTS = f"""
WITH closed AS (
    SELECT DISTINCT ON (t.id) t.id,
           CASE WHEN starts_with(g.text, $1) THEN 'stopped' ELSE 'completed' END AS state,
           CASE WHEN starts_with(g.text, $1) THEN 'pull request closed without merge'
                WHEN starts_with(g.text, $2) THEN 'pull request merged'
                ELSE 'pull request closed' END AS hold
    FROM tickets t
    JOIN ticket_inbox i ON i.ticket_id = t.id
    JOIN triggers g ON g.id = i.trigger_id
    JOIN threads th ON th.id = g.thread_id
    WHERE t.state IN ({_ENDS}) AND t.pr_url IS NOT NULL
      AND th.url = t.pr_url AND g.kind = 'pull_request.closed'
    ORDER BY t.id, g.created_at DESC, g.id DESC
), done AS (
    UPDATE tickets SET state = closed.state, hold = closed.hold, updated_at = now()
    FROM closed WHERE tickets.id = closed.id
      AND tickets.state IN ({_ENDS})
    RETURNING tickets.id, tickets.state
)
SELECT id, state FROM done
"""


async def end_closed_pull_requests(conn: Conn) -> list[asyncpg.Record]:
    """End the tickets whose pull request was merged (completed) or closed without a merge
    (stopped). Rows: id, state."""
    rows: list[asyncpg.Record] = await conn.fetch(
        _CLOSED_PULL_REQUESTS, pr_events.NOT_MERGED, pr_events.MERGED
    )
    return rows


# -- rounds nobody asked for (controlplane.tickets.pr_rounds) -----------------------------


async def count_unasked_round(conn: Conn, ticket_id: str, *, ci: bool, bot: bool) -> None:
    """One more round started by a failed CI result (``ci``) and/or bot events (``bot``)."""
    await conn.execute(
        "UPDATE tickets SET ci_fix_rounds = ci_fix_rounds + $2::int, "
        "bot_rounds = bot_rounds + $3::int WHERE id = $1",
        ticket_id,
        int(ci),
        int(bot),
    )


async def people_stepped_in(conn: Conn, ticket_id: str, at: datetime | None = None) -> None:
    """A person spoke (at ``at``; None: now): the counts of unasked rounds start over."""
    await conn.execute(
        "UPDATE tickets SET ci_fix_rounds = 0, bot_rounds = 0, "
        "loop_since = coalesce($2::timestamptz, now()) WHERE id = $1",
        ticket_id,
        at,
    )


async def hold_ready(conn: Conn, ticket_id: str, hold: str) -> bool:
    """A ``ready`` ticket shows why events no longer wake it; False if it was not ready or
    already showed it."""
    moved = await conn.fetchval(
        "UPDATE tickets SET hold = $2, updated_at = now() "
        "WHERE id = $1 AND state = 'ready' AND hold IS DISTINCT FROM $2 RETURNING id",
        ticket_id,
        hold,
    )
    return moved is not None
