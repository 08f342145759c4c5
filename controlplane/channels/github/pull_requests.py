"""The outbox handler that opens a pull request and records its URL on the ticket.

Effect kind ``open_pull_request``, payload: ``repo`` (owner/name), ``head`` (a branch, or
owner:branch from a fork), ``base``, ``title``, ``body``, and optionally ``ticket_id``.
Opening is idempotent (an open PR from the same head is returned, not duplicated), so the
outbox may run it more than once.
"""

from __future__ import annotations

import logging

import asyncpg

from controlplane.channels.base import ChannelError, Channels, RateLimited
from controlplane.channels.github.adapter import GithubAdapter
from controlplane.channels.github.events import SOURCE
from controlplane.channels.outbound import WAIT_FOR_ADAPTER_SECONDS
from controlplane.effects.handlers import ClaimedEffect, Handler, Permanent, Postpone
from controlplane.ingest.intake import open_thread
from controlplane.pause import hold_while_paused
from controlplane.tickets import events, store, subscriptions

log = logging.getLogger(__name__)

_FIELDS = ("repo", "head", "base", "title")


def open_pull_request_handler(pool: asyncpg.Pool, channels: Channels) -> Handler:
    async def open_pull_request(effect: ClaimedEffect) -> None:
        await hold_while_paused(pool)
        adapter = channels.get(SOURCE)
        if not isinstance(adapter, GithubAdapter):
            raise Postpone(WAIT_FOR_ADAPTER_SECONDS, "GitHub is not configured on this replica")
        payload = effect.payload
        missing = [name for name in _FIELDS if not payload.get(name)]
        if missing:
            raise Permanent(f"open_pull_request needs {', '.join(missing)}")
        try:
            url = await adapter.client.open_pull_request(
                str(payload["repo"]),
                head=str(payload["head"]),
                base=str(payload["base"]),
                title=str(payload["title"]),
                body=str(payload.get("body") or ""),
            )
        except RateLimited as limited:
            raise Postpone(limited.seconds, str(limited)) from None
        except ChannelError as exc:
            raise Permanent(f"github: {exc}") from None
        ticket_id = payload.get("ticket_id")
        if ticket_id:
            await _record(pool, str(ticket_id), str(payload["repo"]), url, str(payload["title"]))
        log.info("pull request %s for %s (ticket %s)", url, payload["repo"], ticket_id or "-")

    return open_pull_request


async def _record(pool: asyncpg.Pool, ticket_id: str, repo: str, url: str, title: str) -> None:
    """The ticket's PR, and its thread handled by the ticket: reviews, CI and the merge
    reach the ticket's worker (the merge or close completes the ticket)."""
    number = url.rstrip("/").rsplit("/", 1)[-1]
    async with pool.acquire() as conn, conn.transaction():
        await store.record_pull_request(conn, ticket_id, url)
        thread_id = await open_thread(conn, SOURCE, f"{repo}#{number}", title, url)
        await subscriptions.subscribe(conn, ticket_id, thread_id)
        await events.add(conn, ticket_id, "pull_request_opened", f"{url} is open")
