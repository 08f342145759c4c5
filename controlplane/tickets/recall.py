"""Chain of Recall: a trigger, thread or ticket by id, summarised, with its neighbours' ids.

The router's and the workers' ``recall`` tools read through here: the model follows ids
from one object to the next instead of being shown everything at once. Read-only.
"""

from __future__ import annotations

from typing import Any

from controlplane.db.pool import Conn

__all__ = ["SNIPPET_CHARS", "recall_thread", "recall_ticket", "recall_trigger"]

SNIPPET_CHARS = 200


def _snippet(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= SNIPPET_CHARS else text[: SNIPPET_CHARS - 1] + "…"


async def recall_trigger(conn: Conn, trigger_id: str) -> dict[str, Any] | None:
    row = await conn.fetchrow(
        "SELECT id, source, thread_id, actor_name, actor_is_bot, kind, text, verdict, "
        "created_at FROM triggers WHERE id = $1",
        trigger_id,
    )
    if row is None:
        return None
    tickets = await conn.fetch(
        "SELECT DISTINCT ticket_id FROM ticket_inbox WHERE trigger_id = $1 "
        "UNION SELECT ticket_id FROM mandates WHERE trigger_id = $1",
        trigger_id,
    )
    return {
        "id": row["id"],
        "source": row["source"],
        "thread": row["thread_id"],
        "from": row["actor_name"] + (" (bot)" if row["actor_is_bot"] else ""),
        "kind": row["kind"],
        "verdict": row["verdict"],
        "at": row["created_at"].isoformat(),
        "text": row["text"][:4000],
        "tickets": sorted(r["ticket_id"] for r in tickets),
    }


async def recall_thread(conn: Conn, thread_id: str) -> dict[str, Any] | None:
    row = await conn.fetchrow(
        "SELECT id, source, external_id, title, url FROM threads WHERE id = $1", thread_id
    )
    if row is None:
        return None
    recent = await conn.fetch(
        "SELECT id, actor_name, text FROM triggers WHERE thread_id = $1 "
        "ORDER BY created_at DESC, id DESC LIMIT 10",
        thread_id,
    )
    related = await conn.fetch(
        "SELECT ticket_id, 'handled by' AS how FROM subscriptions WHERE thread_id = $1 "
        "UNION ALL SELECT ticket_id, 'related to' FROM links WHERE thread_id = $1",
        thread_id,
    )
    return {
        "id": row["id"],
        "source": row["source"],
        "title": row["title"],
        "url": row["url"],
        "recent_events": [
            {"id": r["id"], "from": r["actor_name"], "text": _snippet(r["text"])}
            for r in reversed(recent)
        ],
        "tickets": [{"id": r["ticket_id"], "how": r["how"]} for r in related],
    }


async def recall_ticket(conn: Conn, ticket_id: str) -> dict[str, Any] | None:
    row = await conn.fetchrow(
        "SELECT t.id, t.title, t.state, t.pr_url, d.name AS device, m.kind AS mandate, "
        "m.scope, m.initiator_name, m.trigger_id, m.revoked_at "
        "FROM tickets t LEFT JOIN devices d ON d.id = t.device_id "
        "LEFT JOIN mandates m ON m.ticket_id = t.id WHERE t.id = $1 "
        "ORDER BY m.created_at DESC LIMIT 1",
        ticket_id,
    )
    if row is None:
        return None
    threads = await conn.fetch(
        "SELECT thread_id, 'handled by' AS how FROM subscriptions WHERE ticket_id = $1 "
        "UNION ALL SELECT thread_id, 'related to' FROM links WHERE ticket_id = $1",
        ticket_id,
    )
    return {
        "id": row["id"],
        "title": row["title"],
        "state": row["state"],
        "device": row["device"],
        "pull_request": row["pr_url"],
        "mandate": {
            "kind": row["mandate"],
            "from": row["initiator_name"],
            "trigger": row["trigger_id"],
            "scope": row["scope"],
            "revoked": row["revoked_at"] is not None,
        },
        "threads": [{"id": r["thread_id"], "how": r["how"]} for r in threads],
    }
