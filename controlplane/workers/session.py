"""A worker's conversation, persisted message by message, and what its model calls cost.

Every message is written before anything acts on it: an assistant message with tool calls
is stored before the first call runs, and each result as soon as it is known. A replica
that takes over the round reloads the list and finds at worst tool calls without results,
which :func:`WorkerSession.close_interrupted` answers with "interrupted".
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import asyncpg

from controlplane.db.pool import Conn, Db
from controlplane.settings import LlmPrices
from superagent_shared.ids import new_id

INTERRUPTED = (
    "interrupted: the control plane restarted before this call's result was recorded. It "
    "may or may not have happened; check the real state before repeating it."
)


@dataclass
class WorkerSession:
    id: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    seq: int = 0

    @classmethod
    async def open(
        cls, conn: Conn, session_id: str | None, *, ticket_id: str, model: str
    ) -> tuple[WorkerSession, bool]:
        """The session of ``session_id``, or a new one; and whether it is new."""
        if session_id is not None:
            rows = await conn.fetch(
                "SELECT seq, content FROM session_messages WHERE session_id = $1 ORDER BY seq",
                session_id,
            )
            messages = [message_content(row["content"])["message"] for row in rows]
            return cls(session_id, messages, rows[-1]["seq"] if rows else 0), False
        session = cls(new_id("ses"))
        await conn.execute(
            "INSERT INTO sessions (id, kind, ticket_id, model) VALUES ($1, 'worker', $2, $3)",
            session.id,
            ticket_id,
            model,
        )
        return session, True

    async def add(self, conn: Db, *messages: dict[str, Any]) -> None:
        if not messages:
            return
        first = self.seq + 1
        self.seq += len(messages)
        await conn.execute(
            "INSERT INTO session_messages (id, session_id, seq, role, content) "
            "SELECT i, $1, s, r, c::jsonb "
            "FROM unnest($2::text[], $3::int[], $4::text[], $5::text[]) AS m(i, s, r, c)",
            self.id,
            [new_id("msg") for _ in messages],
            list(range(first, self.seq + 1)),
            [str(m.get("role", "user")) for m in messages],
            [json.dumps({"message": m}, default=str) for m in messages],
        )
        self.messages.extend(messages)

    def unanswered_calls(self) -> list[dict[str, Any]]:
        """Tool calls of the last assistant message that have no result yet."""
        for index in range(len(self.messages) - 1, -1, -1):
            message = self.messages[index]
            if message.get("role") == "assistant":
                answered = {
                    m.get("tool_call_id") for m in self.messages[index + 1 :] if m["role"] == "tool"
                }
                return [c for c in message.get("tool_calls") or [] if c["id"] not in answered]
        return []

    async def close_interrupted(self, conn: Db) -> int:
        """Answer the calls a dead replica left without a result; returns how many."""
        missing = self.unanswered_calls()
        await self.add(
            conn,
            *(
                {"role": "tool", "tool_call_id": call["id"], "content": INTERRUPTED}
                for call in missing
            ),
        )
        return len(missing)

    @property
    def awaiting_model(self) -> bool:
        """Whether the last message asks for a model call (anything but a final answer)."""
        return bool(self.messages) and self.messages[-1].get("role") != "assistant"

    def recent_calls(self) -> list[str]:
        """The signature (name and arguments) of each tool call, oldest first."""
        return [
            canonical_call(call)
            for message in self.messages
            for call in message.get("tool_calls") or []
        ]


def canonical_call(call: dict[str, Any]) -> str:
    """A tool call's name and arguments, the same however the JSON was spelled."""
    function = call.get("function", {})
    return f"{function.get('name')}:{_canonical(function.get('arguments'))}"


def message_content(value: Any) -> dict[str, Any]:
    parsed = json.loads(value) if isinstance(value, str) else value
    assert isinstance(parsed, dict)
    return parsed


def _canonical(arguments: Any) -> str:
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError:
        return str(arguments)
    return json.dumps(parsed, sort_keys=True, separators=(",", ":"))


def cost_of(usage: Any, prices: LlmPrices) -> tuple[int, int, int, Decimal]:
    """(prompt, completion, cached tokens, US dollars) of one call's usage."""
    if usage is None:
        return 0, 0, 0, Decimal(0)
    prompt = int(usage.prompt_tokens or 0)
    completion = int(usage.completion_tokens or 0)
    details = getattr(usage, "prompt_tokens_details", None)
    cached = int(getattr(details, "cached_tokens", 0) or 0) if details is not None else 0
    dollars = (
        Decimal(str(prices.input_usd_per_mtok)) * (prompt - cached)
        + Decimal(str(prices.cached_usd_per_mtok)) * cached
        + Decimal(str(prices.output_usd_per_mtok)) * completion
    ) / Decimal(1_000_000)
    return prompt, completion, cached, dollars.quantize(Decimal("0.000001"))


async def record_call(
    pool: asyncpg.Pool,
    *,
    session_id: str,
    ticket_id: str | None,
    model: str,
    usage: Any,
    prices: LlmPrices,
    latency_ms: int,
    error: str | None,
    prompt_version_id: str | None = None,
) -> None:
    """One model call on record, and on the session's and the ticket's counters."""
    prompt, completion, cached, dollars = cost_of(usage, prices)
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "INSERT INTO llm_calls (id, session_id, model, prompt_tokens, completion_tokens, "
            "cached_tokens, latency_ms, cost_usd, error, batch_size, prompt_version_id) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 1, $10)",
            new_id("llm"),
            session_id,
            model,
            prompt,
            completion,
            cached,
            latency_ms,
            dollars,
            error[:2000] if error else None,
            prompt_version_id,
        )
        if prompt or completion:
            await conn.execute(
                "UPDATE sessions SET prompt_tokens = prompt_tokens + $2, "
                "completion_tokens = completion_tokens + $3, cached_tokens = cached_tokens + $4, "
                "cost_usd = cost_usd + $5, updated_at = now() WHERE id = $1",
                session_id,
                prompt,
                completion,
                cached,
                dollars,
            )
            if ticket_id is None:  # not a worker's call (the watchdog's): no ticket pays
                return
            await conn.execute(
                "UPDATE tickets SET tokens_used = tokens_used + $2, cost_usd = cost_usd + $3, "
                "updated_at = now() WHERE id = $1",
                ticket_id,
                prompt + completion,
                dollars,
            )
