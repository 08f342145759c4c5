"""The Feishu/Lark adapter: events from either transport become Triggers; replies go back.

Events arrive by the HTTP callback (:mod:`.callback`) or the long connection
(:mod:`.receiver`); both end in :meth:`LarkAdapter.handle`. Replies are posted in
the thread of the message that started it, with the reply id as Lark's ``uuid``, so a
retried send posts once; the seen mark is a reaction on the request's message.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict

import httpx

from controlplane.channels.base import (
    Acknowledgement,
    ChannelAdapter,
    ChannelError,
    Ignored,
    OutboundMessage,
    RateLimited,
)
from controlplane.channels.lark import events
from controlplane.channels.lark.client import BotInfo, LarkApi, LarkError
from controlplane.channels.lark.receiver import LongConnection
from controlplane.errors import TransientError
from controlplane.ingest.intake import Ingested, Intake
from controlplane.services import Service
from controlplane.settings import LarkSettings

log = logging.getLogger(__name__)

_NAMES_KEPT = 10_000  # display names remembered (users seen most recently)
# Lark's code for "the app lacks the scope": names are then not looked up again.
_NO_SCOPE = 99991672


class LarkAdapter(ChannelAdapter):
    source = events.SOURCE

    def __init__(self, settings: LarkSettings, intake: Intake) -> None:
        if settings.app_id is None or settings.app_secret is None:
            raise ValueError("the Lark adapter needs app_id and app_secret")
        self.settings = settings
        self.intake = intake
        self.api = LarkApi(
            settings.domain,
            settings.app_id,
            settings.app_secret.get_secret_value(),
            timeout=settings.timeout_seconds,
        )
        self._bot: BotInfo | None = None
        self._bot_lock = asyncio.Lock()
        self._names: OrderedDict[str, str] = OrderedDict()
        self._names_readable = True

    # ------------------------------------------------------------------ inbound

    async def handle(self, payload: dict[str, object]) -> Ingested | Ignored:
        """Ingest one verified schema 2.0 event (InvalidInput if malformed)."""
        message = events.parse(payload)
        if isinstance(message, Ignored):
            return message
        bot = await self.bot() if message.needs_bot else None
        if bot is not None and message.sender_open_id == bot.open_id:
            return Ignored("the bot's own message")
        trigger = events.to_trigger(
            message,
            direct=events.addresses_bot(message, bot),
            sender_name=await self._name_of(message.sender_open_id),
        )
        return await self.intake.ingest(trigger)

    async def bot(self) -> BotInfo:
        """Who the bot is (asked of Lark once); TransientError while Lark cannot say."""
        async with self._bot_lock:
            if self._bot is None:
                try:
                    self._bot = await self.api.bot_info()
                except (ChannelError, RateLimited, httpx.HTTPError) as exc:
                    raise TransientError(
                        f"cannot learn the bot's identity from Lark: {exc}"
                    ) from None
                log.info("lark: the bot is %s (%s)", self._bot.name, self._bot.open_id)
            return self._bot

    async def _name_of(self, open_id: str) -> str | None:
        """The sender's display name, or None (then the actor is named by its open_id)."""
        if open_id in self._names:
            self._names.move_to_end(open_id)
            return self._names[open_id] or None
        if not self._names_readable:
            return None
        try:
            name = await self.api.user_name(open_id) or ""
        except LarkError as exc:
            if exc.code == _NO_SCOPE:
                self._names_readable = False
                log.warning(
                    "lark: cannot read user names (%s); senders are named by their open_id",
                    exc,
                )
                return None
            name = ""  # this user is out of the app's contact range: do not ask again
        except (ChannelError, RateLimited, TransientError, httpx.HTTPError) as exc:
            log.info("lark: no display name for %s this time: %s", open_id, exc)
            return None
        self._names[open_id] = name
        if len(self._names) > _NAMES_KEPT:
            self._names.popitem(last=False)
        return name or None

    # ------------------------------------------------------------------ outbound

    async def send(self, message: OutboundMessage) -> str:
        chat_id, _, root_id = message.thread_external_id.partition(":")
        if not chat_id or not root_id:
            raise ChannelError(
                f"{message.thread_external_id!r} is not a Lark thread (chat_id:message_id)"
            )
        return await self.api.reply(root_id, message.text, uuid=message.reply_id)

    async def acknowledge(self, ack: Acknowledgement) -> None:
        await self.api.react(ack.message_ref, self.settings.ack_emoji)

    def services(self) -> list[Service]:
        if not self.settings.long_connection:
            return []
        # Lark hands each event to one of the app's connected clients, so every replica may
        # hold a connection: no leader needed, and no event is handled twice.
        return [LongConnection(self.settings, self.handle)]

    async def close(self) -> None:
        await self.api.close()
