"""A worker's conversation, persisted message by message.

What its model calls cost is recorded by :mod:`controlplane.llm.client`.

Every message is written before anything acts on it: an assistant message with tool calls
is stored before the first call runs, and each result as soon as it is known. A replica
that takes over the round reloads the list and finds at worst tool calls without results,
which :func:`WorkerSession.close_interrupted` answers with "interrupted".
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from controlplane.db.pool import Conn, Db
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
        """The signature (name and arguments) of each tool call, oldest first; the same call
        repeated within one answer counts once (it runs once)."""
        return [
            signature
            for message in self.messages
            for signature in dict.fromkeys(
                canonical_call(call) for call in message.get("tool_calls") or []
            )
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
