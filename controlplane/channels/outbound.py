"""The outbox handlers that talk to people: replies and acknowledgements, per channel.

A reply (outbox kind ``reply``, written by the router's ``reply`` tool) goes to the adapter
of its thread's source:

* while the agent is paused it waits (:func:`hold_while_paused`);
* a channel with no configured adapter keeps it waiting, postponed hourly, rather than
  failing it: once the channel is configured, the replies queued before go out;
* a reply already recorded in ``sent_messages`` is not sent again (a retry after the send
  and the record both happened but the effect's completion did not);
* IM channels get at most :data:`IM_MAX_WORDS` words: the router's tool refuses longer
  replies, and this cut is the hard limit behind it for any other writer.

An acknowledgement (kind ``acknowledge``, written by ingest for an accepted request) is the
channel's "seen" mark (👀); reactions are idempotent on every channel, so a retry is harmless.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

import asyncpg

from controlplane.channels.base import (
    Acknowledgement,
    ChannelError,
    Channels,
    OutboundMessage,
    RateLimited,
)
from controlplane.effects.handlers import ClaimedEffect, Permanent, Postpone
from controlplane.pause import hold_while_paused
from controlplane.replies import Style, clip_words, style_of

log = logging.getLogger(__name__)

WAIT_FOR_ADAPTER_SECONDS = 3600.0


async def _moot(pool: asyncpg.Pool, payload: dict[str, Any]) -> bool:
    """Whether a guarded reply's condition no longer holds (its ticket moved on)."""
    guard = payload.get("only_while")
    if not isinstance(guard, dict):
        return False
    still = await pool.fetchval(
        "SELECT 1 FROM tickets WHERE id = $1 AND state = $2 AND wait_until = $3::timestamptz",
        str(guard.get("ticket_id")),
        str(guard.get("state")),
        datetime.fromisoformat(str(guard.get("wait_until"))),
    )
    return still is None


def reply_handler(pool: asyncpg.Pool, channels: Channels) -> Any:
    async def send(effect: ClaimedEffect) -> None:
        await hold_while_paused(pool)
        payload = effect.payload
        source = str(payload.get("source", "?"))
        adapter = channels.get(source)
        if adapter is None:
            raise Postpone(WAIT_FOR_ADAPTER_SECONDS, f"{source} is not configured on this replica")
        reply_id = str(payload["reply_id"])
        if await pool.fetchval("SELECT 1 FROM sent_messages WHERE reply_id = $1", reply_id):
            return
        if await _moot(pool, payload):
            log.info("reply %s not sent: its ticket no longer waits as it did", reply_id)
            return
        text = str(payload["text"])
        if style_of(source) is Style.im:
            text = clip_words(text)
        message = OutboundMessage(
            reply_id=reply_id,
            thread_id=str(payload["thread_id"]),
            thread_external_id=str(payload["thread_external_id"]),
            text=text,
            first_try=effect.first_try,
            reply_to=str(payload["reply_to"]) if payload.get("reply_to") else None,
        )
        try:
            external_id = await adapter.send(message)
        except RateLimited as limited:
            raise Postpone(limited.seconds, str(limited)) from None
        except ChannelError as exc:
            raise Permanent(f"{source}: {exc}") from None
        await pool.execute(
            "INSERT INTO sent_messages (reply_id, source, thread_id, external_id, text) "
            "VALUES ($1, $2, $3, $4, $5) ON CONFLICT (reply_id) DO NOTHING",
            reply_id,
            source,
            message.thread_id,
            external_id[:500],
            text,
        )

    return send


def acknowledge_handler(pool: asyncpg.Pool, channels: Channels) -> Any:
    async def acknowledge(effect: ClaimedEffect) -> None:
        await hold_while_paused(pool)
        payload = effect.payload
        adapter = channels.get(str(payload.get("source", "?")))
        if adapter is None:
            log.info("no adapter to acknowledge %s; skipped", payload.get("trigger_id"))
            return  # a late "seen" mark is worthless: do not keep it waiting
        try:
            await adapter.acknowledge(
                Acknowledgement(
                    trigger_id=str(payload["trigger_id"]),
                    thread_external_id=str(payload["thread_external_id"]),
                    message_ref=str(payload["message_ref"]),
                )
            )
        except RateLimited as limited:
            raise Postpone(limited.seconds, str(limited)) from None
        except ChannelError as exc:
            raise Permanent(f"{adapter.source}: {exc}") from None

    return acknowledge
