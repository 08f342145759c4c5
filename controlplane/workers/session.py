"""A worker's conversation, persisted message by message.

What its model calls cost is recorded by :mod:`controlplane.llm.client`.

Every message is written before anything acts on it: an assistant message with tool calls
is stored before the first call runs, and each result as soon as it is known. A replica
that takes over the round reloads the list and finds at worst tool calls without results,
which :func:`WorkerSession.close_interrupted` answers with "interrupted".

Bounded context. :attr:`WorkerSession.messages` is everything that happened, in order;
:meth:`WorkerSession.context` is what the model is shown, which a :class:`Compaction`
shortens (:mod:`controlplane.workers.compaction` decides when and how). A compaction is a
row of the session too (role ``system``, content ``{"compaction": {...}}``, the whole
state each time), so a session reopened after a takeover shows the model exactly the
same context.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from controlplane.db.pool import Conn, Db
from controlplane.llm import sessions
from controlplane.llm.transcript import canonical_call, message_content

INTERRUPTED = (
    "interrupted: the control plane restarted before this call's result was recorded. It "
    "may or may not have happened; check the real state before repeating it."
)
REDUCED_CHARS = 1000  # characters of head, and of tail, a reduced tool output keeps
PROGRESS_NOTE = (
    "Progress so far: the earlier turns of this session, compacted to keep the context "
    "bounded (the brief above is whole; recall(id=msg_...) reads an earlier tool output "
    "in full):\n"
)


@dataclass(frozen=True)
class Compaction:
    """How the context is shortened: its whole state (each compaction row holds one).

    After the brief, the messages up to ``upto_seq`` are replaced by ``summary``; the tool
    outputs up to ``reduced_upto`` are shown as head, tail and how to recall the rest.
    """

    upto_seq: int = 0
    summary: str = ""
    reduced_upto: int = 0

    @classmethod
    def of(cls, record: dict[str, Any]) -> Compaction:
        return cls(
            int(record.get("upto_seq") or 0),
            str(record.get("summary") or ""),
            int(record.get("reduced_upto") or 0),
        )


@dataclass
class WorkerSession:
    id: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    seq: int = 0
    seqs: list[int] = field(default_factory=list)  # each message's seq
    ids: list[str] = field(default_factory=list)  # each message's row id (what recall takes)
    compaction: Compaction = field(default_factory=Compaction)

    @classmethod
    async def open(
        cls, conn: Conn, session_id: str | None, *, ticket_id: str, model: str
    ) -> tuple[WorkerSession, bool]:
        """The session of ``session_id``, or a new one; and whether it is new."""
        if session_id is not None:
            rows = await conn.fetch(
                "SELECT id, seq, content FROM session_messages WHERE session_id = $1 ORDER BY seq",
                session_id,
            )
            session = cls(session_id, seq=rows[-1]["seq"] if rows else 0)
            for row in rows:
                content = message_content(row["content"])
                if "compaction" in content:
                    session.compaction = Compaction.of(content["compaction"])
                    continue
                session.messages.append(content["message"])
                session.seqs.append(row["seq"])
                session.ids.append(row["id"])
            return session, False
        session = cls(await sessions.start(conn, "worker", model, ticket_id=ticket_id))
        return session, True

    async def add(self, conn: Db, *messages: dict[str, Any]) -> None:
        if not messages:
            return
        first = self.seq + 1
        self.seq += len(messages)
        seqs = list(range(first, self.seq + 1))
        ids = await sessions.append(
            conn,
            self.id,
            first,
            [str(m.get("role", "user")) for m in messages],
            [json.dumps({"message": m}, default=str) for m in messages],
        )
        self.messages.extend(messages)
        self.seqs.extend(seqs)
        self.ids.extend(ids)

    async def compact(self, conn: Db, compaction: Compaction, **about: Any) -> None:
        """Record a new compaction state (``about``: what it did, for people) and use it."""
        self.seq += 1
        await sessions.note(
            conn, self.id, self.seq, {"compaction": {**asdict(compaction), **about}}
        )
        self.compaction = compaction

    # -- what the model is shown ---------------------------------------------------------

    @property
    def head(self) -> int:
        """How many messages open the session and stay whole: up to the brief (the first
        user message, which holds the mandate)."""
        for index, message in enumerate(self.messages):
            if message.get("role") == "user":
                return index + 1
        return 0

    def context(self, compaction: Compaction | None = None) -> list[dict[str, Any]]:
        """The messages the model is shown (after the system prompt), under ``compaction``
        (by default the session's own)."""
        shown = self.compaction if compaction is None else compaction
        head = self.head
        out = list(self.messages[:head])
        if shown.summary:
            out.append({"role": "user", "content": PROGRESS_NOTE + shown.summary})
        calls: set[str] = set()
        for index in range(head, len(self.messages)):
            seq, message = self.seqs[index], self.messages[index]
            if seq <= shown.upto_seq:
                continue
            role = message.get("role")
            if role == "assistant":
                calls.update(call.get("id") for call in message.get("tool_calls") or [])
            elif role == "tool":
                if message.get("tool_call_id") not in calls:
                    continue  # its call is compacted away: an orphan the API would refuse
                if seq <= shown.reduced_upto:
                    message = reduced(message, self.ids[index])
            out.append(message)
        return out

    def blocks(self, compaction: Compaction | None = None) -> list[int]:
        """Indexes (into :attr:`messages`) where the turns shown in full begin: each message
        but a tool result starts one, so a cut there never parts calls from their results."""
        shown = self.compaction if compaction is None else compaction
        return [
            index
            for index in range(self.head, len(self.messages))
            if self.seqs[index] > shown.upto_seq and self.messages[index].get("role") != "tool"
        ]

    # -- the loop's questions ------------------------------------------------------------

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


def reduced(message: dict[str, Any], message_id: str) -> dict[str, Any]:
    """A tool result cut to its head and tail, and how to read the rest (``recall``)."""
    text = message.get("content")
    if not isinstance(text, str) or len(text) <= 3 * REDUCED_CHARS:
        return message
    content = {
        "reduced": f"this output was {len(text):,} characters; its middle is left out "
        "to keep the context bounded",
        "head": text[:REDUCED_CHARS],
        "tail": text[-REDUCED_CHARS:],
        "read_more": f"recall(id={message_id!r}, offset={REDUCED_CHARS})",
    }
    return {**message, "content": json.dumps(content, ensure_ascii=False)}
