"""The one small interface every channel adapter implements.

Inbound, an adapter verifies what the channel sends (signatures, tokens) and hands each
event to :meth:`controlplane.ingest.intake.Intake.ingest` as an ``IncomingTrigger``: from an
HTTP route (webhooks, event callbacks) or from a background :class:`Service` (Slack Socket
Mode, Matrix sync, Lark's long connection, GitHub polling).

Outbound, the outbox calls the adapter of a thread's source:

* :meth:`ChannelAdapter.send` posts a reply on the thread. It runs at least once: any but
  the ``first_try`` may follow a send that happened but was not recorded, so an adapter
  either uses the channel's own idempotency key (Matrix transaction ids, Lark's ``uuid``)
  or looks for its message before posting again (GitHub, Slack: the ``reply_id`` marker).
* :meth:`ChannelAdapter.acknowledge` marks an accepted request as seen (👀), at once.

Adapters raise :class:`ChannelError` for failures that will not pass by themselves (bad
credentials, a deleted thread): the effect is parked with the message instead of retried.
Anything else (timeouts, 5xx, rate limits) is retried with backoff by the outbox.

A receiver that polls keeps where it got to in ``channel_state`` (:func:`save_state`, the
table's one writer), one row per source and key.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from controlplane.db.pool import Db
from controlplane.services import Service


async def save_state(db: Db, source: str, key: str, value: Any) -> None:
    """What a receiver of ``source`` keeps under ``key`` (JSON), replacing what it had."""
    await db.execute(
        "INSERT INTO channel_state (source, key, value) VALUES ($1, $2, $3) "
        "ON CONFLICT (source, key) DO UPDATE SET value = excluded.value, updated_at = now()",
        source,
        key,
        value,
    )


@dataclass(frozen=True)
class OutboundMessage:
    reply_id: str  # the dedupe key: one message per reply_id, however often retried
    thread_id: str
    thread_external_id: str
    text: str
    # False: an earlier try may have posted it already (the outbox's ClaimedEffect.first_try)
    first_try: bool = True
    # The channel's id of the message this answers, where the channel answers in place
    # (GitHub: ``pull_request_review_comment:<id>``, a reply in that review thread).
    reply_to: str | None = None


@dataclass(frozen=True)
class Acknowledgement:
    trigger_id: str
    thread_external_id: str
    message_ref: str  # the channel's id of the message to mark as seen


@dataclass(frozen=True)
class Ignored:
    """An event a channel delivered that is deliberately not a Trigger, and why."""

    reason: str


class ChannelError(Exception):
    """A failure retrying will not fix; the message says what to change."""


class RateLimited(Exception):
    """The channel asked us to wait ``seconds`` before calling again."""

    def __init__(self, seconds: float, message: str = "") -> None:
        super().__init__(message or f"rate limited for {seconds:.0f}s")
        self.seconds = seconds


class ChannelAdapter(ABC):
    """One channel: ``source`` names it on threads and triggers."""

    source: ClassVar[str]

    @abstractmethod
    async def send(self, message: OutboundMessage) -> str:
        """Post ``message`` on its thread; return the channel's id of the posted message."""

    async def acknowledge(self, ack: Acknowledgement) -> None:
        """Mark an accepted request as seen. Channels without reactions do nothing."""
        return None

    def services(self) -> list[Service]:
        """Background loops run on every replica (socket connections)."""
        return []

    def leader_services(self) -> list[Callable[[], Service]]:
        """Makers of background loops run only on the replica that leads (polling, sync);
        a fresh one starts each time this replica gains the lead."""
        return []

    async def close(self) -> None:
        """Release clients and connections."""
        return None


class Channels:
    """The configured adapters, by source."""

    def __init__(self, adapters: list[ChannelAdapter] | None = None) -> None:
        self._by_source: dict[str, ChannelAdapter] = {}
        for adapter in adapters or []:
            self.add(adapter)

    def add(self, adapter: ChannelAdapter) -> None:
        if adapter.source in self._by_source:
            raise ValueError(f"two adapters for {adapter.source}")
        self._by_source[adapter.source] = adapter

    def get(self, source: str) -> ChannelAdapter | None:
        return self._by_source.get(source)

    def __iter__(self) -> Iterator[ChannelAdapter]:
        return iter(self._by_source.values())

    def sources(self) -> list[str]:
        return sorted(self._by_source)

    async def close(self) -> None:
        for adapter in self._by_source.values():
            await adapter.close()
