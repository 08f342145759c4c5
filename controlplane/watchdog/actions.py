"""What the watchdog can do about a finding. Each action is recorded on the finding."""

from __future__ import annotations

import logging
from datetime import datetime

import asyncpg

from controlplane import pause
from controlplane.alerts import alert_admin
from controlplane.domain import CLOSED_TICKET_STATES
from controlplane.findings import Open, acted
from controlplane.replies import enqueue_reply
from controlplane.settings import WatchdogSettings
from controlplane.tickets import control, events, reports, slots
from superagent_shared.ids import stable_id

log = logging.getLogger(__name__)

WATCHDOG = "the watchdog"


async def nudge(pool: asyncpg.Pool, finding: Open, ticket_id: str, text: str) -> None:
    """A message in the worker's inbox; it reads it at its next step (an idle worker wakes)."""
    await events.add(pool, ticket_id, "watchdog", text)
    await acted(pool, finding.id, "nudge", text)
    log.info("watchdog: nudged %s: %s", ticket_id, text)


async def requeue(pool: asyncpg.Pool, finding: Open, ticket_id: str) -> bool:
    """End the replica's hold on the round: another replica takes it over and resumes the
    same session (its own replica, renewing, finds the lease no longer its and lets go)."""
    moved = await slots.hand_over(pool, ticket_id)
    if moved is not None:
        await acted(pool, finding.id, "requeue", f"round {moved} handed to another replica")
        log.info("watchdog: requeued %s (round %s)", ticket_id, moved)
    return moved is not None


async def stop(pool: asyncpg.Pool, finding: Open, ticket_id: str, why: str) -> None:
    """Stop the ticket and tell the thread it came from why."""
    async with pool.acquire() as conn, conn.transaction():
        was = await control.stop(conn, ticket_id, by=WATCHDOG)
        thread = await reports.home_thread(conn, ticket_id)
        if thread is not None and was not in CLOSED_TICKET_STATES:
            await enqueue_reply(
                conn,
                thread,
                f"I stopped {ticket_id}: {why}. Ask again (or `superagent tickets show "
                f"{ticket_id}`) if it should go on.",
                stable_id("msg", f"watchdog-stop:{finding.id}"),
            )
    await acted(pool, finding.id, "stop", why)
    log.warning("watchdog: stopped %s: %s", ticket_id, why)


async def pause_agent(pool: asyncpg.Pool, finding: Open, why: str) -> None:
    """Hold everything (events are still recorded) until an admin resumes."""
    await pause.pause(pool, WATCHDOG, why)
    await acted(pool, finding.id, "pause", why)
    log.warning("watchdog: paused the agent: %s", why)


async def alert(pool: asyncpg.Pool, settings: WatchdogSettings, finding: Open, text: str) -> bool:
    """Tell the admin channel, once per finding. Without one, the finding is the record."""
    async with pool.acquire() as conn, conn.transaction():
        sent = await alert_admin(conn, settings.admin_thread, f"watchdog-alert:{finding.id}", text)
        await acted(
            conn, finding.id, "alert", text if sent else f"(no admin channel configured) {text}"
        )
    return sent


def ago(at: datetime, now: datetime) -> str:
    minutes = (now - at).total_seconds() / 60
    return f"{minutes:.0f} min" if minutes < 120 else f"{minutes / 60:.1f} h"
