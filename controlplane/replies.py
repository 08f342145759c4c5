"""What a reply is, and how anyone who talks to people queues one.

A reply is the outbox's ``reply`` effect (``channels/outbound.py`` sends it through the
thread's adapter). It is written by the router's ``reply`` tool, by workers (results,
questions), approvals, alerts and the watchdog: all of them queue it here, below the
channels, in their own transaction.

Replies have a style per channel (docs/architecture.md, *Ingest and routing*): GitHub
threads get structured replies, every chat channel at most :data:`IM_MAX_WORDS` words.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from controlplane.db.pool import Conn
from controlplane.domain import EffectKind
from controlplane.effects.outbox import enqueue
from superagent_shared.ids import stable_id


class Style(StrEnum):
    """How replies on a channel are written (docs/architecture.md, *Ingest and routing*)."""

    im = "im"  # chat: at most IM_MAX_WORDS words, decisions, questions and results only
    structured = "structured"  # GitHub: background, change, validation; complete


IM_MAX_WORDS = 100
STRUCTURED_SOURCES = frozenset({"github"})


def style_of(source: str) -> Style:
    """GitHub threads get structured replies; every chat channel gets IM style."""
    return Style.structured if source in STRUCTURED_SOURCES else Style.im


_WORD = re.compile(r"\S+")


def word_count(text: str) -> int:
    return len(_WORD.findall(text))


def clip_words(text: str, limit: int = IM_MAX_WORDS) -> str:
    """``text`` cut to ``limit`` words (whitespace kept), with an ellipsis when cut."""
    matches = list(_WORD.finditer(text))
    if len(matches) <= limit:
        return text
    return text[: matches[limit - 1].end()] + " …"


def run_result_id(trigger_id: str) -> str:
    """The reply id of a ``/run``'s outcome (its result, or why it did not run): one message
    per request however often the handler runs, and the key by which a chat knows the
    promised result arrived (:mod:`controlplane.channels.webchat.progress`)."""
    return stable_id("msg", f"run-result:{trigger_id}")


@dataclass(frozen=True)
class WhileWaiting:
    """Send a delayed reply only if its ticket still waits as it did when it was queued
    (the same state and wait end): a device back within the delay is nobody's news."""

    ticket_id: str
    state: str
    wait_until: datetime

    def as_json(self) -> dict[str, str]:
        return {
            "ticket_id": self.ticket_id,
            "state": self.state,
            "wait_until": self.wait_until.isoformat(),
        }


async def enqueue_reply(
    conn: Conn,
    thread_id: str,
    text: str,
    reply_id: str,
    *,
    clip: bool = True,
    delay: float = 0.0,
    only_while: WhileWaiting | None = None,
    reply_to: str | None = None,
) -> bool:
    """Queue a reply written by the program rather than the router's model (a command's
    result, a notice that a device is away), cut to the channel's limit when ``clip``;
    sent after ``delay`` seconds, and then only if ``only_while`` still holds. ``reply_to``:
    the channel's id of the message it answers in place (a GitHub review comment).

    Keyed by ``reply_id``: queued again, or after it was sent, it is still one message.
    Returns False when there is no such thread or the reply was already sent.
    """
    row = await conn.fetchrow("SELECT source, external_id FROM threads WHERE id = $1", thread_id)
    if row is None:
        return False
    if await conn.fetchval("SELECT 1 FROM sent_messages WHERE reply_id = $1", reply_id):
        return False
    if clip and style_of(row["source"]) is Style.im:
        text = clip_words(text, IM_MAX_WORDS)
    await enqueue(
        conn,
        EffectKind.REPLY,
        reply_id,
        {
            "reply_id": reply_id,
            "thread_id": thread_id,
            "source": row["source"],
            "thread_external_id": row["external_id"],
            "text": text,
            **({"only_while": only_while.as_json()} if only_while is not None else {}),
            **({"reply_to": reply_to} if reply_to is not None else {}),
        },
        delay=delay,
    )
    return True
