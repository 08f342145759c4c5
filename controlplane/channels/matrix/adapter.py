"""The Matrix adapter: replies in ``m.thread`` threads, 👀 reactions, and the sync loop.

A reply is an ``m.room.message`` in the thread of its root event, with the rich-reply
fallback to the root for clients without threads. It is sent with
``PUT /rooms/{room}/send/m.room.message/{txnId}`` and the reply id as the transaction id:
the homeserver answers a repeated transaction with the event it already made, so a retried
send posts nothing new. A transaction is remembered for a limited time only (Synapse: about
half an hour), so a retry (not ``first_try``) first looks for the bot's recent message that
carries the reply id in its content (:data:`REPLY_ID_KEY`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import asyncpg
from nio import MessageDirection

from controlplane.channels.base import (
    Acknowledgement,
    ChannelAdapter,
    ChannelError,
    OutboundMessage,
)
from controlplane.channels.matrix import events
from controlplane.channels.matrix.client import MatrixAccount
from controlplane.channels.matrix.receiver import MatrixSync
from controlplane.ingest.intake import Intake
from controlplane.services import Service
from controlplane.settings import MatrixSettings

SEEN = "👀"
REPLY_ID_KEY = "io.superagent.reply_id"  # in the content of every reply the bot posts
_LOOK_BACK = 50  # of the bot's own recent messages in the room, when a retry checks


def reply_content(text: str, root_event_id: str, reply_id: str) -> dict[str, Any]:
    return {
        "msgtype": "m.text",
        "body": text,
        "m.relates_to": {
            "rel_type": "m.thread",
            "event_id": root_event_id,
            # Clients without threads show it as a reply to the root.
            "is_falling_back": True,
            "m.in_reply_to": {"event_id": root_event_id},
        },
        REPLY_ID_KEY: reply_id,
    }


def seen_content(event_id: str) -> dict[str, Any]:
    return {"m.relates_to": {"rel_type": "m.annotation", "event_id": event_id, "key": SEEN}}


class MatrixAdapter(ChannelAdapter):
    source = events.SOURCE

    def __init__(self, settings: MatrixSettings, intake: Intake, pool: asyncpg.Pool) -> None:
        self.account = MatrixAccount(settings)
        self.intake = intake
        self.pool = pool
        self._client = self.account.client()

    async def send(self, message: OutboundMessage) -> str:
        room_id, root = _thread(message.thread_external_id)
        if not message.first_try:
            earlier = await self._sent_before(room_id, message.reply_id)
            if earlier is not None:
                return earlier
        content = reply_content(message.text, root, message.reply_id)
        sent = await self.account.call(
            self._client,
            lambda c: c.room_send(room_id, "m.room.message", content, tx_id=message.reply_id),
            f"reply in {room_id}",
        )
        return str(sent.event_id)

    async def acknowledge(self, ack: Acknowledgement) -> None:
        room_id, _root = _thread(ack.thread_external_id)
        await self.account.call(
            self._client,
            lambda c: c.room_send(
                room_id, "m.reaction", seen_content(ack.message_ref), tx_id=f"seen-{ack.trigger_id}"
            ),
            f"react to {ack.message_ref} in {room_id}",
            # Already there (a retry after the homeserver forgot the transaction): done.
            accept=frozenset({"M_DUPLICATE_ANNOTATION"}),
        )

    def leader_services(self) -> list[Callable[[], Service]]:
        return [lambda: MatrixSync(self.account, self.intake, self.pool)]

    async def close(self) -> None:
        await self._client.close()

    async def _sent_before(self, room_id: str, reply_id: str) -> str | None:
        """The event id of the bot's message for ``reply_id``, if it is among its recent ones."""
        recent = await self.account.call(
            self._client,
            lambda c: c.room_messages(
                room_id,
                direction=MessageDirection.back,
                limit=_LOOK_BACK,
                message_filter={"senders": [self.account.user_id], "types": ["m.room.message"]},
            ),
            f"look for an earlier reply in {room_id}",
        )
        for event in recent.chunk:
            source = event.source
            content = source.get("content")
            if isinstance(content, dict) and content.get(REPLY_ID_KEY) == reply_id:
                return str(source["event_id"])
        return None


def _thread(external_id: str) -> tuple[str, str]:
    target = events.parse_thread(external_id)
    if target is None:
        raise ChannelError(f"{external_id!r} is not a Matrix thread id (room id|root event id)")
    return target
