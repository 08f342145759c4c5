"""Live updates: tell open console pages that what they show has changed.

Each page watches a few topics (``tickets``, ``triggers``, …). While at least one console
socket is open on this replica, one loop reads a fingerprint of every watched topic once a
second, in one query, and sends ``{"type": "changed", "topics": […]}`` to the sockets that
watch a topic whose fingerprint moved; the page then fetches its JSON again. Polling, not
LISTEN: several things the console shows change without a notification (a command's output
growing, a dropped trigger, a device going quiet), a fingerprint catches them all, and a
lost wake-up cannot exist. With no socket open the loop does not run at all.

Each fingerprint is a few aggregates over indexed or small sets of rows. The database is
the only truth: a page refreshes itself when its socket (re)connects, so nothing missed
while it was away stays missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import asyncpg

from controlplane.errors import InvalidInput
from controlplane.gateway.devices import ONLINE_WINDOW
from controlplane.services import critical_loop, sleep_unless

log = logging.getLogger(__name__)

POLL_SECONDS = 1.0
MAX_QUEUED = 100  # frames waiting for a slow socket before it is dropped (the page reconnects)

_ONLINE = f"interval '{int(ONLINE_WINDOW.total_seconds())} seconds'"

# One text-valued SQL expression per topic.
TOPICS: dict[str, str] = {
    # The status strip: pause, the router's leader, its inbox.
    "status": (
        "concat_ws('|', (SELECT paused_at FROM pause), "
        "(SELECT holder || (expires_at < now())::text FROM leases WHERE name = 'router'), "
        "(SELECT count(*) FROM triggers WHERE routed_at IS NULL))"
    ),
    # Tickets and their rounds and reports (a model call bumps tickets.updated_at).
    "tickets": (
        "concat_ws('|', (SELECT max(updated_at) FROM tickets), (SELECT count(*) FROM tickets), "
        "(SELECT count(*) FROM assignments WHERE ended_at IS NULL), "
        "(SELECT max(created_at) FROM reports))"
    ),
    # The conversation of every running round: its newest message, by the (session_id, seq)
    # index. A round's end moves it too (the round leaves the set).
    "transcript": (
        "(SELECT string_agg(a.id || ':' || coalesce((SELECT max(m.seq) FROM session_messages m "
        "WHERE m.session_id = a.session_id), 0), ',' ORDER BY a.id) FROM assignments a "
        "WHERE a.ended_at IS NULL)"
    ),
    # Unfinished commands (state and output size) and every device's next sequence
    # number, which moves with each new command, even one that ends within a second.
    "commands": (
        "concat_ws('|', (SELECT md5(coalesce(string_agg(id || ':' || state || ':' || "
        "output_size, ',' ORDER BY id), '')) FROM commands "
        "WHERE state IN ('queued', 'delivered', 'running')), "
        "(SELECT sum(next_seq) FROM devices))"
    ),
    "devices": (
        "(SELECT md5(coalesce(string_agg(concat_ws(':', id, name, revoked_at, "
        "connected_replica, policy_hash, sandbox, version, repositories_reported_at, "
        f"last_seen_at > now() - {_ONLINE}), ',' ORDER BY id), '')) FROM devices)"
    ),
    "triggers": (
        "concat_ws('|', (SELECT max(created_at) FROM triggers), "
        "(SELECT count(*) FROM triggers WHERE routed_at IS NULL))"
    ),
    "costs": "(SELECT max(created_at)::text FROM llm_calls)",
    "findings": (
        "concat_ws('|', (SELECT count(*) || max(last_seen_at)::text FROM watchdog_findings "
        "WHERE resolved_at IS NULL), (SELECT max(created_at) FROM watchdog_actions))"
    ),
    "effects": "(SELECT count(*)::text FROM effects WHERE dead_at IS NOT NULL)",
    "versions": (
        "concat_ws('|', (SELECT max(created_at) FROM prompt_versions), "
        "(SELECT max(created_at) FROM policy_versions))"
    ),
}


def parse_topics(raw: str | None) -> frozenset[str]:
    """The ``topics`` parameter of a socket: comma-separated names from :data:`TOPICS`."""
    names = frozenset(name.strip() for name in (raw or "").split(",") if name.strip())
    unknown = sorted(names - TOPICS.keys())
    if unknown:
        raise InvalidInput(
            f"unknown topic(s) {', '.join(unknown)}; known: {', '.join(sorted(TOPICS))}"
        )
    if not names:
        raise InvalidInput("watch at least one topic (topics=tickets,devices,…)")
    return names


class Watcher:
    """One console socket: its topics, and the frames waiting to be written to it."""

    def __init__(self, topics: frozenset[str]) -> None:
        self.topics = topics
        self.frames: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.dropped = asyncio.Event()  # fell too far behind, or the hub failed

    def push(self, frame: dict[str, Any]) -> None:
        if self.frames.qsize() >= MAX_QUEUED:
            self.dropped.set()
            return
        self.frames.put_nowait(frame)


class ConsoleHub:
    """The sockets open on this replica, and the loop that runs while there are any."""

    def __init__(self, pool: asyncpg.Pool, *, interval: float = POLL_SECONDS) -> None:
        self.pool = pool
        self.interval = interval
        self._watchers: set[Watcher] = set()
        self._seen: dict[str, str | None] = {}
        self._loop: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    def join(self, watcher: Watcher) -> None:
        self._watchers.add(watcher)
        if self._loop is None or self._loop.done():
            self._stopping = asyncio.Event()
            self._loop = asyncio.get_running_loop().create_task(
                self._run(self._stopping), name="console-hub"
            )

    async def leave(self, watcher: Watcher) -> None:
        self._watchers.discard(watcher)
        if not self._watchers and self._loop is not None:
            self._stopping.set()
            loop, self._loop = self._loop, None
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(loop, timeout=2)
            self._seen.clear()

    async def _run(self, stopping: asyncio.Event) -> None:
        async def step() -> None:
            await self.poll()
            await sleep_unless(stopping, self.interval)

        try:
            await critical_loop("console hub", step, stopping)
        except Exception:
            # Already logged by critical_loop. The sockets close, and their pages
            # reconnect, which starts a fresh loop.
            for watcher in self._watchers:
                watcher.dropped.set()

    async def poll(self) -> None:
        """Read the watched topics' fingerprints once; tell the watchers of those that moved."""
        topics = sorted(set().union(*(w.topics for w in self._watchers)))
        if not topics:
            return
        columns = ", ".join(f"{TOPICS[name]} AS {name}" for name in topics)
        row = await self.pool.fetchrow(f"SELECT {columns}")
        assert row is not None
        moved = set()
        for name in topics:
            value = row[name]
            if name in self._seen and self._seen[name] != value:
                moved.add(name)
            self._seen[name] = value
        if not moved:
            return
        for watcher in list(self._watchers):
            mine = sorted(moved & watcher.topics)
            if mine:
                watcher.push({"type": "changed", "topics": mine})
