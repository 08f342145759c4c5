"""The replica's chat sockets and what wakes them.

Each connected socket is a :class:`ChatClient` watching some conversations. When a
conversation changes (someone said something, the agent replied), its watchers here are
sent whatever they have not seen yet, read from the database: the database is the only
truth, so a lost wake-up costs latency, never a message, and any replica serves any client.

Changes on this replica wake its watchers directly. Changes on other replicas arrive as a
NOTIFY on ``Notify.WEBCHAT`` (payload: the conversation id), sent in the transaction
that stored the message, so the row is visible when the notification arrives. One LISTEN
connection per replica carries them for all its sockets; after a reconnect every watched
conversation is read again, for anything missed meanwhile.

One refresh at a time per conversation (changes during it make it run once more), and one
read serves every watcher of it; each watcher filters by what it has already been sent.

A socket may also *track* a message it said (``"track": true``): it is then sent that
message's ``progress`` frame (:mod:`controlplane.channels.webchat.progress`) whenever it
changes, until it is settled. What makes progress (a router's turn ending, an effect
dying) sends no notification, so conversations with tracked messages are also refreshed
every :data:`PROGRESS_POLL_SECONDS`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from controlplane.channels.webchat import history, progress
from controlplane.channels.webchat.history import ChatMessage
from controlplane.db.listen import listen
from controlplane.domain import Notify
from controlplane.errors import InvalidInput
from controlplane.ingest.admission import Actor
from controlplane.services import Service, is_transient
from superagent_shared import backoff

log = logging.getLogger(__name__)

# Rows are stamped when their statement starts and visible when it commits: a row may show
# up after a later-stamped one was sent. Re-reading this far back (and remembering what was
# sent that recently) catches it.
SLACK = timedelta(seconds=60)
MAX_QUEUED = 1000  # frames waiting for a slow socket before it is closed (the page reloads)
MAX_WATCHED = 50  # conversations one socket may watch
MAX_TRACKED = 20  # unsettled messages one socket may track
PROGRESS_POLL_SECONDS = 1.0


@dataclass
class _Sent:
    """What one socket was sent of one conversation."""

    ids: dict[str, datetime] = field(default_factory=dict)
    newest: datetime | None = None

    def fresh(self, message: ChatMessage) -> bool:
        if message.id in self.ids:
            return False
        if self.newest is not None and message.at < self.newest - SLACK:
            return False  # forgotten below; it was sent long ago
        self.ids[message.id] = message.at
        if self.newest is None or message.at > self.newest:
            self.newest = message.at
        return True

    def forget_old(self) -> None:
        if self.newest is not None and len(self.ids) > 100:
            cut = self.newest - SLACK
            self.ids = {key: at for key, at in self.ids.items() if at >= cut}


class ChatClient:
    """One chat socket: who it is, what it watches, and the frames waiting to be written."""

    def __init__(self, actor: Actor) -> None:
        self.actor = actor
        self.frames: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.overflowed = asyncio.Event()
        self.watching: dict[str, _Sent] = {}
        # conversation -> tracked trigger -> the last progress frame sent (None: none yet)
        self.tracking: dict[str, dict[str, dict[str, Any] | None]] = {}

    def check_can_track(self) -> None:
        if sum(len(t) for t in self.tracking.values()) >= MAX_TRACKED:
            raise InvalidInput(f"a socket tracks at most {MAX_TRACKED} unsettled messages")

    def track(self, thread: str, trigger: str) -> None:
        self.tracking.setdefault(thread, {}).setdefault(trigger, None)

    def report(self, thread: str, found: dict[str, progress.Progress]) -> None:
        """Send the progress of this socket's tracked messages that changed; a settled one
        is sent once more and no longer tracked."""
        tracked = self.tracking.get(thread)
        if not tracked or thread not in self.watching:
            return
        for trigger, last in list(tracked.items()):
            now = found.get(trigger)
            if now is None:
                continue
            frame = now.frame()
            if frame != last:
                self.push(frame)
                tracked[trigger] = frame
            if now.settled:
                del tracked[trigger]
        if not tracked:
            del self.tracking[thread]

    def push(self, frame: dict[str, Any]) -> None:
        if self.frames.qsize() >= MAX_QUEUED:
            self.overflowed.set()
            return
        self.frames.put_nowait(frame)

    def deliver(self, thread: str, messages: list[ChatMessage]) -> None:
        sent = self.watching.get(thread)
        if sent is None:
            return  # stopped watching meanwhile
        for message in messages:
            if sent.fresh(message):
                self.push(message.frame())
        sent.forget_old()


class ChatHub(Service):
    name = "webchat"

    def __init__(self, pool: asyncpg.Pool, dsn: str) -> None:
        super().__init__()
        self.pool = pool
        self.dsn = dsn
        self._watchers: dict[str, set[ChatClient]] = {}
        self._dirty: set[str] = set()
        self._refreshing: dict[str, asyncio.Task[None]] = {}
        self._listener = listen(
            dsn, on_notify={Notify.WEBCHAT: self.changed}, on_connect=self._reread, name=self.name
        )

    # -- sockets -------------------------------------------------------------------------

    def watch(self, client: ChatClient, thread: str) -> None:
        """Send ``client`` the conversation's history, then each new message."""
        if thread not in client.watching:
            if len(client.watching) >= MAX_WATCHED:
                raise InvalidInput(f"a socket watches at most {MAX_WATCHED} conversations")
            client.watching[thread] = _Sent()
        self._watchers.setdefault(thread, set()).add(client)
        self.changed(thread)

    def unwatch(self, client: ChatClient, thread: str) -> None:
        client.watching.pop(thread, None)
        client.tracking.pop(thread, None)
        watchers = self._watchers.get(thread)
        if watchers is not None:
            watchers.discard(client)
            if not watchers:
                del self._watchers[thread]

    def leave(self, client: ChatClient) -> None:
        for thread in list(client.watching):
            self.unwatch(client, thread)

    # -- changes -------------------------------------------------------------------------

    def changed(self, thread: str) -> None:
        """The conversation has new messages: have its watchers here sent them."""
        if thread not in self._watchers:
            return
        self._dirty.add(thread)
        if thread not in self._refreshing:
            task = asyncio.get_running_loop().create_task(self._refresh(thread))
            self._refreshing[thread] = task

    async def announce(self, thread: str) -> None:
        """Wake this conversation's watchers on every replica (after its row committed)."""
        self.changed(thread)
        try:
            await self.pool.execute("SELECT pg_notify($1, $2)", Notify.WEBCHAT, thread)
        except Exception as exc:
            if not is_transient(exc):
                raise
            # The message is stored and this replica's watchers have it; others see it
            # with the conversation's next change.
            log.warning("webchat: could not notify other replicas about %s: %s", thread, exc)

    async def _refresh(self, thread: str) -> None:
        failures = 0
        try:
            while thread in self._dirty and self._watchers.get(thread):
                self._dirty.discard(thread)
                watchers = list(self._watchers[thread])
                try:
                    # Progress is read before the messages: every reply it counts as arrived
                    # is then among the messages, which are sent first, so that a client
                    # that stops at "settled" has had every reply.
                    tracked = {t for client in watchers for t in client.tracking.get(thread, {})}
                    promised = {t: await progress.of(self.pool, t, thread) for t in tracked}
                    found = await history.messages(
                        self.pool, thread, since=_since(watchers, thread)
                    )
                except Exception as exc:
                    if not is_transient(exc):
                        log.exception("webchat: reading conversation %s failed", thread)
                        return
                    failures += 1
                    self._dirty.add(thread)
                    await asyncio.sleep(backoff.delay(failures, base=0.2, cap=5.0))
                    continue
                failures = 0
                for client in watchers:
                    client.deliver(thread, found)
                    client.report(thread, promised)
        finally:
            self._refreshing.pop(thread, None)

    def _reread(self) -> None:
        """Listening (again): anything missed while not listening is read."""
        for thread in list(self._watchers):
            self.changed(thread)

    # -- the loop ------------------------------------------------------------------------

    @property
    def listening(self) -> bool:
        """Whether other replicas' changes reach this one now."""
        return self._listener.listening

    async def run(self) -> None:
        async with self._listener:
            while not self.stopping.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), PROGRESS_POLL_SECONDS)
                for thread, watchers in list(self._watchers.items()):
                    if any(client.tracking.get(thread) for client in watchers):
                        self.changed(thread)

    async def close(self) -> None:
        tasks = list(self._refreshing.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def _since(watchers: list[ChatClient], thread: str) -> datetime | None:
    """How far back one read must go to serve every watcher (None: the whole history)."""
    newest = [client.watching[thread].newest for client in watchers if thread in client.watching]
    if not newest or any(at is None for at in newest):
        return None
    return min(at for at in newest if at is not None) - SLACK
