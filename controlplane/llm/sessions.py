"""Model sessions and their messages: the one writer of ``sessions`` and
``session_messages``.

A session is one conversation with a model (the router's, a ticket's worker's, the
watchdog's drift judge), kept so that a successor can resume it and people can read it;
what its calls cost is added up on it as they are recorded (:mod:`.client`).
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from controlplane.db.pool import Db
from superagent_shared.ids import new_id, new_ids


async def start(
    db: Db,
    kind: str,
    model: str,
    *,
    ticket_id: str | None = None,
    prompt_version_id: str | None = None,
) -> str:
    """A new session of ``kind`` (router, worker, watchdog); its id."""
    session_id = new_id("ses")
    await db.execute(
        "INSERT INTO sessions (id, kind, ticket_id, model, prompt_version_id) "
        "VALUES ($1, $2, $3, $4, $5)",
        session_id,
        kind,
        ticket_id,
        model,
        prompt_version_id,
    )
    return session_id


async def append(
    db: Db,
    session_id: str,
    first_seq: int,
    roles: Sequence[str],
    contents: Sequence[str],
    *,
    prompt_version_id: str | None = None,
) -> list[str]:
    """Messages numbered from ``first_seq``, each a role and its content as JSON text;
    their ids."""
    ids = new_ids("msg", len(contents))
    await db.execute(
        "INSERT INTO session_messages (id, session_id, seq, role, content, prompt_version_id) "
        "SELECT i, $1, s, r, c::jsonb, $6 "
        "FROM unnest($2::text[], $3::int[], $4::text[], $5::text[]) AS m(i, s, r, c)",
        session_id,
        ids,
        list(range(first_seq, first_seq + len(contents))),
        list(roles),
        list(contents),
        prompt_version_id,
    )
    return ids


async def note(db: Db, session_id: str, seq: int, content: dict[str, Any]) -> None:
    """A system message that is the session's state rather than a turn (a compaction)."""
    await db.execute(
        "INSERT INTO session_messages (id, session_id, seq, role, content) "
        "VALUES ($1, $2, $3, 'system', $4::jsonb)",
        new_id("msg"),
        session_id,
        seq,
        content,
    )


async def charge(
    db: Db, session_id: str, prompt: int, completion: int, cached: int, dollars: Decimal | None
) -> None:
    """One call's tokens and cost added to its session's."""
    await db.execute(
        "UPDATE sessions SET prompt_tokens = prompt_tokens + $2, "
        "completion_tokens = completion_tokens + $3, "
        "cached_tokens = cached_tokens + $4, cost_usd = cost_usd + $5, "
        "updated_at = now() WHERE id = $1",
        session_id,
        prompt,
        completion,
        cached,
        dollars,
    )
