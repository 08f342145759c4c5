"""The Matrix sync loop: the bot's rooms' new messages become Triggers; invitations, joins.

Runs once per deployment (a leader service). Each round is one ``/sync`` long poll:

1. every invitation is accepted (the bot joins the room);
2. every new message of every joined room goes to ingest (see
   :mod:`controlplane.channels.matrix.events` for what becomes a Trigger, and how);
3. only then is the batch's ``next_batch`` token stored in ``channel_state``, so a restart
   resumes after the last batch fully ingested: nothing is missed, and what a crash made
   us read twice is deduplicated by ingest on the event id.

Without a stored token (the first start) the bot starts from now: one sync with an empty
timeline gives the token, and the history of its rooms is never replayed as requests. When
a room's timeline in a batch is ``limited`` (more happened since the last token than one
sync returns), the gap is read back with ``/messages``, bounded by :data:`MAX_GAP_EVENTS`:
down to that token, or for a room just joined, to the bot's invitation (what was said
since, even while the bot was down, was said to it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

import asyncpg
from nio import AsyncClient, MessageDirection

from controlplane import failures
from controlplane.channels.base import ChannelError, RateLimited, save_state
from controlplane.channels.matrix import events
from controlplane.channels.matrix.client import MatrixAccount
from controlplane.channels.matrix.events import BotIdentity
from controlplane.errors import InvalidInput
from controlplane.ingest.intake import Intake
from controlplane.services import Service, critical_loop, sleep_unless

log = logging.getLogger(__name__)

T = TypeVar("T")

TIMELINE_TYPES = ["m.room.message", "m.room.member", "m.room.encrypted"]
TIMELINE_LIMIT = 50
MAX_GAP_EVENTS = 1000  # read back after a long outage, per room and batch
_GAP_PAGE = 100
_CONFIG_ERROR_PAUSE = 60.0  # bad credentials: retry this often (other channels keep working)
_NOTHING = {"not_types": ["*"]}


def sync_filter(timeline_limit: int) -> dict[str, Any]:
    """What the bot asks /sync for: messages and memberships, member state lazily."""
    return {
        "presence": _NOTHING,
        "account_data": _NOTHING,
        "room": {
            "timeline": {"limit": timeline_limit, "types": TIMELINE_TYPES},
            "state": {"lazy_load_members": True},
            "ephemeral": _NOTHING,
            "account_data": _NOTHING,
        },
    }


class SyncTokens:
    """The last fully ingested ``next_batch``, per bot account, in ``channel_state``."""

    def __init__(self, pool: asyncpg.Pool, user_id: str) -> None:
        self.pool = pool
        self.key = f"sync:{user_id}"

    async def load(self) -> str | None:
        value = await self.pool.fetchval(
            "SELECT value FROM channel_state WHERE source = $1 AND key = $2",
            events.SOURCE,
            self.key,
        )
        token = value.get("next_batch") if isinstance(value, dict) else None
        return token if isinstance(token, str) else None

    async def save(self, token: str) -> None:
        await save_state(self.pool, events.SOURCE, self.key, {"next_batch": token})


class MatrixSync(Service):
    """Syncs the bot's account and ingests its rooms' messages (see the module docstring)."""

    name = "matrix-sync"

    def __init__(
        self,
        account: MatrixAccount,
        intake: Intake,
        pool: asyncpg.Pool,
        *,
        timeline_limit: int = TIMELINE_LIMIT,
    ) -> None:
        super().__init__()
        self.account = account
        self.intake = intake
        self.tokens = SyncTokens(pool, account.user_id)
        self.timeout_ms = int(account.settings.sync_timeout_seconds * 1000)
        self.filter = sync_filter(timeline_limit)
        self._token: str | None = None
        self._bot: BotIdentity | None = None
        self._joined: dict[str, int] = {}  # room id -> joined members, while known
        self._warned_encrypted: set[str] = set()

    async def run(self) -> None:
        client = self.account.client()
        try:
            await critical_loop(self.name, lambda: self._round(client), self.stopping)
        finally:
            await client.close()

    async def _round(self, client: AsyncClient) -> None:
        try:
            await self._sync_once(client)
        except RateLimited as limited:
            await sleep_unless(self.stopping, limited.seconds)
        except ChannelError as exc:
            # A configuration problem: say so loudly, keep the rest of the replica running.
            log.error("matrix: %s; retrying in %.0fs", exc, _CONFIG_ERROR_PAUSE)
            await sleep_unless(self.stopping, _CONFIG_ERROR_PAUSE)

    async def _sync_once(self, client: AsyncClient) -> None:
        bot = self._bot or await self._identity(client)
        if self._token is None:
            self._token = await self.tokens.load()
        since = self._token
        if since is None:
            # The first start: from now on, without the rooms' history.
            start = sync_filter(0)
            response = await self._call(client, lambda c: c.sync(0, start), "first sync")
        else:
            response = await self._unless_stopping(
                self._call(
                    client,
                    lambda c: c.sync(self.timeout_ms, self.filter, since=since),
                    "sync",
                )
            )
            if response is None:
                return
        for room_id in response.rooms.invite:
            await self._join(client, room_id)
        if since is not None:
            for room_id, room in response.rooms.join.items():
                await self._ingest_room(client, bot, room_id, room, since)
        await self.tokens.save(response.next_batch)
        self._token = response.next_batch

    async def _identity(self, client: AsyncClient) -> BotIdentity:
        user_id = self.account.user_id
        try:
            found = await self._call(
                client, lambda c: c.get_displayname(user_id), "read the bot's display name"
            )
            name = found.displayname
        except ChannelError as exc:
            log.warning("matrix: %s; mentions by display name will not be recognised", exc)
            name = None
        self._bot = BotIdentity(user_id, name if isinstance(name, str) else None)
        return self._bot

    async def _join(self, client: AsyncClient, room_id: str) -> None:
        try:
            await self._call(client, lambda c: c.join(room_id), f"join {room_id}")
        except ChannelError as exc:  # the invitation was withdrawn, the room is gone...
            log.warning("matrix: not joining %s: %s", room_id, exc)
        else:
            log.info("matrix: joined %s on invitation", room_id)

    async def _ingest_room(
        self, client: AsyncClient, bot: BotIdentity, room_id: str, room: Any, since: str
    ) -> None:
        timeline = [event.source for event in room.timeline.events]
        if room.timeline.limited and room.timeline.prev_batch:
            # A room just joined is read back to the invitation (see events.since_invited),
            # any other down to the previous batch.
            joined = any(events.became(e, bot.user_id, "join") for e in timeline)
            gap = await self._read_gap(
                client,
                room_id,
                room.timeline.prev_batch,
                until=None if joined else since,
                invited=bot.user_id if joined else None,
            )
            timeline = gap + timeline
        self._note_membership(room_id, room)
        title = self._room_name(client, room_id)
        for event in events.since_invited(timeline, bot.user_id):
            if event.get("type") == "m.room.encrypted":
                self._warn_encrypted(room_id)
                continue
            try:
                message = events.parse_message(room_id, event, bot)
            except Exception as exc:  # our bug, but this event's failure: the batch goes on
                item = f"{room_id} {str(event.get('event_id'))[:200]}"
                failures.logged(log, "matrix", item, exc, "skipped; the batch goes on")
                with contextlib.suppress(asyncpg.PostgresError, OSError):
                    await failures.record(self.tokens.pool, "matrix", item, exc, quarantined=True)
                continue
            if message is None:
                continue
            direct = message.mentions_bot or await self._is_direct_chat(client, room_id)
            try:
                await self.intake.ingest(events.to_trigger(message, direct=direct, room_name=title))
            except InvalidInput as exc:  # an event no Trigger can hold; the rest go on
                log.warning("matrix: skipped %s in %s: %s", message.event_id[:200], room_id, exc)

    async def _read_gap(
        self,
        client: AsyncClient,
        room_id: str,
        start: str,
        *,
        until: str | None,
        invited: str | None,
    ) -> list[dict[str, Any]]:
        """The events before ``start``, oldest first: back to ``until`` (a previous batch),
        or to the invitation of ``invited``."""
        newest_first: list[dict[str, Any]] = []
        page: str | None = start
        while page and len(newest_first) < MAX_GAP_EVENTS:
            found = await self._call(
                client,
                lambda c, page=page: c.room_messages(
                    room_id,
                    start=page,
                    end=until,
                    direction=MessageDirection.back,
                    limit=_GAP_PAGE,
                    message_filter={"types": TIMELINE_TYPES},
                ),
                f"read the recent history of {room_id}",
            )
            if not found.chunk:
                break
            chunk = [event.source for event in found.chunk]
            newest_first.extend(chunk)
            if invited and any(events.became(e, invited, "invite") for e in chunk):
                break
            page = found.end if found.end != page else None
        if len(newest_first) >= MAX_GAP_EVENTS:
            log.warning(
                "matrix: more than %d events in %s since the last sync; older ones skipped",
                MAX_GAP_EVENTS,
                room_id,
            )
        return list(reversed(newest_first))

    def _note_membership(self, room_id: str, room: Any) -> None:
        summary = getattr(room, "summary", None)
        joined = getattr(summary, "joined_member_count", None)
        if isinstance(joined, int):
            self._joined[room_id] = joined
            return
        changed = [*room.state, *room.timeline.events]
        if any(event.source.get("type") == "m.room.member" for event in changed):
            self._joined.pop(room_id, None)

    async def _is_direct_chat(self, client: AsyncClient, room_id: str) -> bool:
        """A room of the bot and one other member: everything said there is said to it."""
        if room_id not in self._joined:
            found = await self._call(
                client, lambda c: c.joined_members(room_id), f"list the members of {room_id}"
            )
            self._joined[room_id] = len(found.members)
        return self._joined[room_id] == 2

    @staticmethod
    def _room_name(client: AsyncClient, room_id: str) -> str | None:
        room = client.rooms.get(room_id)
        name = room.named_room_name() if room is not None else None
        return name if isinstance(name, str) else None

    def _warn_encrypted(self, room_id: str) -> None:
        if room_id not in self._warned_encrypted:
            self._warned_encrypted.add(room_id)
            log.warning(
                "matrix: %s is end-to-end encrypted; the bot cannot read it. Use an "
                "unencrypted room to talk to the agent",
                room_id,
            )

    async def _call(self, client: AsyncClient, request: Any, what: str) -> Any:
        return await self.account.call(client, request, what)

    async def _unless_stopping(self, work: Awaitable[T]) -> T | None:
        """``work``'s result, or None if the service is asked to stop first (a long poll
        must not hold up a shutdown)."""
        task = asyncio.ensure_future(work)
        stop = asyncio.ensure_future(self.stopping.wait())
        try:
            done, _ = await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not task.done():
                task.cancel()
        if task in done:
            return task.result()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return None
