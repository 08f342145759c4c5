"""The web chat's adapter: replies go into the database, and every replica's sockets hear.

There is no outside platform: the chat's record of a reply *is* its ``sent_messages`` row.
So :meth:`WebChatAdapter.send` writes that row itself, and the NOTIFY that wakes the sockets
of every replica in the same statement. Were it left to the outbox (which records the row
only after ``send`` returns), a notification could arrive before the row is visible and a
socket would read nothing new. The outbox's own insert then finds the row and does nothing;
a retried send does the same, so a reply appears exactly once however often it is sent.
"""

from __future__ import annotations

import asyncpg

from controlplane.channels.base import ChannelAdapter, ChannelError, OutboundMessage
from controlplane.channels.context import ChannelContext
from controlplane.channels.webchat.events import SOURCE
from controlplane.channels.webchat.hub import ChatHub
from controlplane.domain import Notify
from controlplane.ingest.intake import Intake
from controlplane.services import Service
from controlplane.settings import Settings

# The data-modifying CTE runs whether or not its row is new; the notification goes out at
# commit, when the row is there to be read.
_RECORD = f"""
WITH recorded AS (
    INSERT INTO sent_messages (reply_id, source, thread_id, external_id, text)
    VALUES ($1, '{SOURCE}', $2, $1, $3)
    ON CONFLICT (reply_id) DO NOTHING
)
SELECT pg_notify('{Notify.WEBCHAT}', $4)
"""


class WebChatAdapter(ChannelAdapter):
    source = SOURCE

    def __init__(self, ctx: ChannelContext) -> None:
        self.settings: Settings = ctx.settings
        self.pool: asyncpg.Pool = ctx.pool
        self.intake: Intake = ctx.intake
        self.hub = ChatHub(ctx.pool, ctx.dsn)

    async def send(self, message: OutboundMessage) -> str:
        try:
            await self.pool.execute(
                _RECORD,
                message.reply_id,
                message.thread_id,
                message.text,
                message.thread_external_id,
            )
        except asyncpg.ForeignKeyViolationError:
            raise ChannelError(f"conversation {message.thread_external_id} is gone") from None
        self.hub.changed(message.thread_external_id)  # this replica's sockets, at once
        return message.reply_id

    # acknowledge(): nothing. A chat message's fate is in its ``accepted`` frame already
    # (verdict and route), so no "seen" mark (and no acknowledge effect) is needed.

    def services(self) -> list[Service]:
        return [self.hub]

    async def close(self) -> None:
        await self.hub.close()
