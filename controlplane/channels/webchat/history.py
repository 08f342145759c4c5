"""What a conversation holds, read from the tables every replica shares.

A web chat conversation is a thread of source ``web`` whose external id is the conversation
id. Its messages are the people's triggers on it and the agent's ``sent_messages``; nothing
else is stored for the chat, so a page reload, another replica and ``superagent say`` all
see the same history.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from controlplane.channels.webchat.events import SOURCE
from controlplane.ingest.routing import REPORT_SOURCE

HISTORY_LIMIT = 500  # most recent messages a conversation shows
THREADS_LIMIT = 100  # most recent conversations listed


@dataclass(frozen=True)
class ChatMessage:
    id: str  # the trigger id (people) or the reply id (the agent)
    thread: str  # the conversation id
    role: str  # "person", "agent", or "worker" (a ticket's report on its home thread)
    author: str
    text: str
    at: datetime
    client_id: str | None  # the sender's dedupe key, so a page can match its own message

    def frame(self) -> dict[str, Any]:
        return {
            "type": "message",
            "thread": self.thread,
            "id": self.id,
            "role": self.role,
            "author": self.author,
            "text": self.text,
            "at": self.at.isoformat(),
            "client_id": self.client_id,
        }


# Newest first, so that LIMIT keeps the latest; callers get them oldest first.
_MESSAGES = f"""
SELECT id, role, author, external_id, text, at FROM (
    SELECT t.id,
           CASE WHEN t.source = '{REPORT_SOURCE}' THEN 'worker' ELSE 'person' END AS role,
           t.actor_name AS author, t.external_id, t.text,
           t.created_at AS at
    FROM triggers t JOIN threads th ON th.id = t.thread_id
    WHERE th.source = '{SOURCE}' AND th.external_id = $1
      AND ($2::timestamptz IS NULL OR t.created_at >= $2)
    UNION ALL
    SELECT s.reply_id, 'agent', 'agent', NULL, s.text, s.sent_at
    FROM sent_messages s JOIN threads th ON th.id = s.thread_id
    WHERE th.source = '{SOURCE}' AND th.external_id = $1
      AND ($2::timestamptz IS NULL OR s.sent_at >= $2)
) m
ORDER BY at DESC, id DESC
LIMIT $3
"""


def client_id_of(trigger_external_id: str) -> str:
    """The client id in a trigger's external id (``<actor id>:<client id>``)."""
    return trigger_external_id.rpartition(":")[2]


async def messages(
    pool: asyncpg.Pool, thread: str, *, since: datetime | None = None, limit: int = HISTORY_LIMIT
) -> list[ChatMessage]:
    """The conversation's messages (from ``since`` on, when given), oldest first."""
    rows = await pool.fetch(_MESSAGES, thread, since, limit)
    return [
        ChatMessage(
            id=row["id"],
            thread=thread,
            role=row["role"],
            author=row["author"],
            text=row["text"],
            at=row["at"],
            client_id=client_id_of(row["external_id"]) if row["external_id"] else None,
        )
        for row in reversed(rows)
    ]


async def exists(pool: asyncpg.Pool, thread: str) -> bool:
    found = await pool.fetchval(
        "SELECT 1 FROM threads WHERE source = $1 AND external_id = $2", SOURCE, thread
    )
    return found is not None


async def conversation_of(pool: asyncpg.Pool, thread_id: str) -> str:
    """The conversation id of the thread with internal id ``thread_id``."""
    external = await pool.fetchval("SELECT external_id FROM threads WHERE id = $1", thread_id)
    return str(external)


async def conversations(pool: asyncpg.Pool, actor_id: str) -> list[dict[str, Any]]:
    """The conversations ``actor_id`` has spoken in, most recently active first."""
    rows = await pool.fetch(
        f"""
        SELECT th.external_id, th.title, th.created_at,
               greatest(
                   (SELECT max(created_at) FROM triggers WHERE thread_id = th.id),
                   (SELECT max(sent_at) FROM sent_messages WHERE thread_id = th.id)
               ) AS last_at
        FROM threads th
        WHERE th.source = '{SOURCE}'
          AND EXISTS (SELECT 1 FROM triggers t WHERE t.thread_id = th.id AND t.actor_id = $1)
        ORDER BY last_at DESC NULLS LAST, th.external_id
        LIMIT $2
        """,
        actor_id,
        THREADS_LIMIT,
    )
    return [
        {
            "thread": row["external_id"],
            "title": row["title"] or row["external_id"],
            "created_at": row["created_at"].isoformat(),
            "last_at": (row["last_at"] or row["created_at"]).isoformat(),
        }
        for row in rows
    ]
