"""The Slack adapter: events in (from the Events API route or Socket Mode), replies and 👀 out.

Inbound, :meth:`SlackAdapter.receive` takes a verified ``event_callback`` body and ingests
the message it carries (:mod:`.events` decides which count). Its ``event_id`` is the
trigger's external id, so Slack's redeliveries (HTTP retries, Socket Mode retries) find the
trigger already recorded; a delivery marked as a retry is looked up before anything else,
so it is answered at once.

Outbound, a reply goes into its thread (``chat.postMessage`` with ``thread_ts``) carrying
Slack message metadata ``superagent_reply`` / ``{"reply_id": ...}``. A retried send
(not ``first_try``) first reads the thread (``conversations.replies`` with
``include_all_metadata``) and returns the message already there instead of posting twice.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from controlplane.channels.base import (
    Acknowledgement,
    ChannelAdapter,
    ChannelError,
    Ignored,
    OutboundMessage,
    RateLimited,
)
from controlplane.channels.slack import events
from controlplane.channels.slack.client import SlackError, WebApi
from controlplane.channels.slack.directory import Directory
from controlplane.channels.slack.events import Identity
from controlplane.channels.slack.receiver import SocketModeService
from controlplane.errors import InvalidInput, NotFound, TransientError
from controlplane.ingest.intake import IncomingTrigger, Ingested, Intake, ThreadRef
from controlplane.services import Service
from controlplane.settings import SlackSettings

SOURCE = "slack"
REPLY_EVENT_TYPE = "superagent_reply"  # Slack message metadata marking the agent's replies
ACK_REACTION = "eyes"
_TITLE_CHARS = 100


class SlackAdapter(ChannelAdapter):
    source = SOURCE

    def __init__(
        self,
        settings: SlackSettings,
        intake: Intake,
        *,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        if settings.bot_token is None:
            raise ValueError("the Slack adapter needs slack.bot_token")
        self.settings = settings
        self.intake = intake
        self._owns_client = client is None
        self._http = client or httpx.AsyncClient(timeout=settings.timeout_seconds)
        self.bot = WebApi(
            settings.api_url, settings.bot_token, "SUPERAGENT_SLACK__BOT_TOKEN", self._http
        )
        self.app = (
            WebApi(settings.api_url, settings.app_token, "SUPERAGENT_SLACK__APP_TOKEN", self._http)
            if settings.app_token is not None
            else None
        )
        self.directory = Directory(self.bot)
        self._identity: Identity | None = None
        self._identity_lock = asyncio.Lock()

    # ------------------------------------------------------------------ inbound

    async def identity(self) -> Identity:
        """The agent's own user and bot ids (``auth.test``), read once per process.

        Raises TransientError (the event is redelivered later) when Slack cannot tell."""
        async with self._identity_lock:
            if self._identity is None:
                try:
                    body = await self.bot.call("auth.test", form={})
                except (ChannelError, RateLimited) as exc:
                    raise TransientError(f"cannot tell the agent's Slack identity: {exc}") from None
                user_id = body.get("user_id")
                if not isinstance(user_id, str) or not user_id:
                    raise TransientError("Slack auth.test named no user_id")
                bot_id, team_id = body.get("bot_id"), body.get("team_id")
                self._identity = Identity(
                    user_id,
                    bot_id if isinstance(bot_id, str) else None,
                    team_id if isinstance(team_id, str) and team_id else None,
                )
            return self._identity

    async def receive(self, callback: Any, *, retried: bool = False) -> Ingested | Ignored:
        """Ingest the message an ``event_callback`` carries (see the module docstring)."""
        event_id = callback.get("event_id") if isinstance(callback, dict) else None
        if retried and isinstance(event_id, str) and event_id:
            try:
                return await self.intake.original(SOURCE, event_id)
            except NotFound:
                pass  # the first delivery never got recorded: this one counts
        me = await self.identity()
        message = events.parse(callback, me)
        if isinstance(message, Ignored):
            return message
        assert isinstance(callback, dict)
        actor = await self.directory.actor(message, home_team=me.team_id)
        title = None
        if message.starts_thread and message.text.strip():
            title = message.text.strip().splitlines()[0][:_TITLE_CHARS]
        return await self.intake.ingest(
            IncomingTrigger(
                source=SOURCE,
                external_id=message.event_id,
                thread=ThreadRef(message.thread_external_id, title=title),
                actor=actor,
                kind=message.kind,
                text=message.text,
                direct=message.direct,
                # Without the deprecated verification token: no secrets in the database.
                payload=json.dumps({k: v for k, v in callback.items() if k != "token"}).encode(),
                ack_ref=message.ack_ref,
            )
        )

    # ----------------------------------------------------------------- outbound

    async def send(self, message: OutboundMessage) -> str:
        channel, thread_ts = _ref(message.thread_external_id)
        if not message.first_try:
            posted = await self._posted(channel, thread_ts, message.reply_id)
            if posted is not None:
                return f"{channel}:{posted}"
        body = await self.bot.call(
            "chat.postMessage",
            json={
                "channel": channel,
                "thread_ts": thread_ts,
                "text": escape(message.text),
                "metadata": {
                    "event_type": REPLY_EVENT_TYPE,
                    "event_payload": {"reply_id": message.reply_id},
                },
                "unfurl_links": False,
                "unfurl_media": False,
            },
        )
        return f"{channel}:{body.get('ts', '')}"

    async def _posted(self, channel: str, thread_ts: str, reply_id: str) -> str | None:
        """The ts of the reply ``reply_id`` if an earlier attempt posted it in the thread."""
        form = {"channel": channel, "ts": thread_ts, "include_all_metadata": "true", "limit": "200"}
        async for item in self.bot.pages("conversations.replies", form, "messages"):
            metadata = item.get("metadata")
            if (
                isinstance(metadata, dict)
                and metadata.get("event_type") == REPLY_EVENT_TYPE
                and isinstance(metadata.get("event_payload"), dict)
                and metadata["event_payload"].get("reply_id") == reply_id
            ):
                return str(item.get("ts", ""))
        return None

    async def acknowledge(self, ack: Acknowledgement) -> None:
        channel, ts = _ref(ack.message_ref)
        try:
            await self.bot.call(
                "reactions.add", json={"channel": channel, "timestamp": ts, "name": ACK_REACTION}
            )
        except SlackError as exc:
            if exc.code != "already_reacted":  # a retry after a lost answer: done already
                raise

    # ---------------------------------------------------------------- lifecycle

    def services(self) -> list[Service]:
        if self.app is None:
            return []
        return [SocketModeService(self, self.app)]

    async def close(self) -> None:
        if self._owns_client:
            await self._http.aclose()


def escape(text: str) -> str:
    """Slack's three control characters escaped, so that a reply shows what it says: no
    ``<!channel>`` pings or disguised links from text the agent repeats."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _ref(ref: str) -> tuple[str, str]:
    try:
        return events.split_ref(ref)
    except InvalidInput as exc:
        raise ChannelError(str(exc)) from None
