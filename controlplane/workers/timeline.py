"""What a ticket's worker did, round by round: the one timeline people read.

:func:`timeline` builds it from the record for both the console's ticket page and
``superagent tickets show --transcript``, so the two never tell different stories. Each
round (an ``assignments`` row) holds the session messages written during it, as entries:
what the control plane told the worker (its brief, events, notes), what the worker said,
each tool call with its arguments, each result, and each compaction of its context.

Long texts are capped (:data:`LINES` lines, :data:`CHARS` characters; a call's arguments to
one line of :data:`ARGS_CHARS`); an entry says what the cap left out, and the whole text is
behind the message's id (:func:`message_text`), the same ``msg_`` id the worker's own
``recall`` tool takes.

It shows what the session stored, as the model saw it (command output was redacted on the
device before it was stored), and reads no other table's content: nothing reaches people
here that the record does not already hold. Read-only; who may ask is the caller's rule.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal

import asyncpg

from controlplane.db.pool import Db
from controlplane.domain import from_iso
from controlplane.errors import InvalidInput, NotFound
from controlplane.llm.transcript import canonical_arguments, message_content
from controlplane.tickets.events import HEADER as EVENTS_HEADER

__all__ = [
    "ARGS_CHARS",
    "CHARS",
    "LINES",
    "MESSAGES",
    "Entry",
    "Round",
    "Timeline",
    "cap",
    "message_text",
    "timeline",
]

LINES = 12  # lines of a text shown inline
CHARS = 1500  # characters of a text shown inline
ARGS_CHARS = 300  # characters of a call's arguments, on one line
MESSAGES = 500  # the latest messages a timeline holds (a page refreshes it live)
ID_CHARS = 40

CONTROL_PLANE = "control plane"  # who speaks to the worker: brief, events, notes
WORKER = "worker"

Kind = Literal["brief", "events", "note", "said", "call", "result", "compacted"]


@dataclass(frozen=True)
class Entry:
    """One thing in a round: who spoke, and what (capped; ``more`` says what is left out)."""

    kind: Kind
    who: str  # CONTROL_PLANE, WORKER, or the tool's name for a result
    text: str
    message_id: str  # the recall id of the whole text
    at: datetime
    more: str | None = None  # "37 more lines": what the cap left out
    tool: str | None = None  # a call's or a result's tool
    call_id: str | None = None
    error: bool = False  # a result that is a refusal or an error
    pending: bool = False  # a call whose result is not in yet
    form: str | None = None  # a call the model wrote in its text: how (tagged, fenced, …)

    @property
    def heading(self) -> str:
        """Who spoke, and how, in a few words (the same on every surface)."""
        if self.kind == "call":
            written = f" (written in the text: {self.form})" if self.form else ""
            return f"{self.who} → {self.tool}{written}"
        if self.kind == "result":
            return f"← {self.who}" + (" (error)" if self.error else "")
        if self.kind == "said":
            return self.who
        what = "context compacted" if self.kind == "compacted" else self.kind
        return f"{self.who}: {what}"

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "who": self.who,
            "heading": self.heading,
            "text": self.text,
            "more": self.more,
            "recall": self.message_id,
            "at": self.at.isoformat(),
            "tool": self.tool,
            "call_id": self.call_id,
            "error": self.error,
            "pending": self.pending,
            "form": self.form,
        }


@dataclass(frozen=True)
class Round:
    """One assignment of the ticket and what was said during it."""

    id: str
    number: int  # 1 for the ticket's first round
    woken_by: str
    slot: str
    outcome: str | None
    model_calls: int
    started: datetime
    ended: datetime | None
    entries: tuple[Entry, ...] = ()

    @property
    def running(self) -> bool:
        return self.ended is None

    @property
    def status(self) -> str:
        """How it ended (``ready``, ``waiting_device``, …), or ``running``."""
        return "running" if self.running else self.outcome or "ended"

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "number": self.number,
            "woken_by": self.woken_by,
            "slot": self.slot,
            "outcome": self.status,
            "running": self.running,
            "model_calls": self.model_calls,
            "started": self.started.isoformat(),
            "ended": self.ended.isoformat() if self.ended else None,
            "entries": [entry.as_json() for entry in self.entries],
        }


@dataclass(frozen=True)
class Timeline:
    ticket_id: str
    title: str
    state: str
    rounds: tuple[Round, ...]
    earlier: int = 0  # older messages left out (over :data:`MESSAGES`)

    def as_json(self) -> dict[str, Any]:
        return {
            "ticket": self.ticket_id,
            "title": self.title,
            "state": self.state,
            "earlier": self.earlier,
            "rounds": [round_.as_json() for round_ in self.rounds],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Timeline:
        """What :meth:`as_json` made (a deployment's answer over HTTP)."""
        return cls(
            ticket_id=data["ticket"],
            title=data["title"],
            state=data["state"],
            earlier=data["earlier"],
            rounds=tuple(_round(r) for r in data["rounds"]),
        )


def _round(data: dict[str, Any]) -> Round:
    running = data["running"]
    return Round(
        id=data["id"],
        number=data["number"],
        woken_by=data["woken_by"],
        slot=data["slot"],
        outcome=None if running or data["outcome"] == "ended" else data["outcome"],
        model_calls=data["model_calls"],
        started=datetime.fromisoformat(data["started"]),
        ended=from_iso(data["ended"]),
        entries=tuple(_entry(e) for e in data["entries"]),
    )


def _entry(data: dict[str, Any]) -> Entry:
    return Entry(
        kind=data["kind"],
        who=data["who"],
        text=data["text"],
        message_id=data["recall"],
        at=datetime.fromisoformat(data["at"]),
        more=data["more"],
        tool=data["tool"],
        call_id=data["call_id"],
        error=data["error"],
        pending=data["pending"],
        form=data["form"],
    )


# -- reading -------------------------------------------------------------------------------

# The ticket's worker messages, newest first; ``first_user`` (over all of a session's rows,
# before the limit) tells the brief apart from later notes.
_MESSAGES = """
SELECT * FROM (
    SELECT m.id, m.seq, m.role, m.content, m.created_at, s.created_at AS session_at,
           m.session_id, count(*) OVER () AS total,
           min(m.seq) FILTER (WHERE m.role = 'user') OVER (PARTITION BY m.session_id)
               AS first_user
    FROM session_messages m JOIN sessions s ON s.id = m.session_id
    WHERE s.ticket_id = $1 AND s.kind = 'worker'
) found ORDER BY session_at DESC, session_id DESC, seq DESC LIMIT $2
"""


async def timeline(db: Db, ticket_id: str, *, limit: int = MESSAGES) -> Timeline:
    """The ticket's rounds, oldest first, each with its entries; NotFound for no ticket."""
    ticket = await db.fetchrow("SELECT title, state FROM tickets WHERE id = $1", ticket_id)
    if ticket is None:
        raise NotFound(f"no ticket {ticket_id} (see `superagent tickets list --all`)")
    rounds = await db.fetch(
        "SELECT id, slot, woken_by, turns, outcome, created_at, ended_at FROM assignments "
        "WHERE ticket_id = $1 ORDER BY created_at, id",
        ticket_id,
    )
    rows = list(reversed(await db.fetch(_MESSAGES, ticket_id, limit)))
    entries = _entries(rows)
    # A message belongs to the round that had started when it was written: rounds of one
    # ticket never overlap (one active assignment per ticket), and the database's clock
    # stamped both.
    starts = [row["created_at"] for row in rounds]
    placed: list[list[Entry]] = [[] for _ in rounds]
    for entry in entries:
        if placed:
            placed[max(0, bisect.bisect_right(starts, entry.at) - 1)].append(entry)
    return Timeline(
        ticket_id,
        ticket["title"],
        ticket["state"],
        tuple(
            Round(
                id=row["id"],
                number=number,
                woken_by=row["woken_by"],
                slot=row["slot"],
                outcome=row["outcome"],
                model_calls=row["turns"],
                started=row["created_at"],
                ended=row["ended_at"],
                entries=tuple(found),
            )
            for number, (row, found) in enumerate(zip(rounds, placed, strict=True), start=1)
        ),
        earlier=rows[0]["total"] - len(rows) if rows else 0,
    )


async def message_text(db: Db, ticket_id: str, message_id: str) -> str:
    """One message of the ticket's worker sessions, whole, as the timeline words it.

    InvalidInput for what is not a message id; NotFound for a message of another ticket,
    so a ticket's address never reads another ticket's conversation."""
    if not message_id.startswith("msg_") or len(message_id) > ID_CHARS:
        raise InvalidInput(f"{message_id[:ID_CHARS]!r} is not a message id (msg_…)")
    row = await db.fetchrow(
        "SELECT m.id, m.seq, m.role, m.content, m.created_at, "
        "(SELECT min(seq) FROM session_messages u WHERE u.session_id = m.session_id "
        "AND u.role = 'user') AS first_user "
        "FROM session_messages m JOIN sessions s ON s.id = m.session_id "
        "WHERE m.id = $1 AND s.ticket_id = $2 AND s.kind = 'worker'",
        message_id,
        ticket_id,
    )
    if row is None:
        raise NotFound(f"no message {message_id} in the worker sessions of {ticket_id}")
    whole = _entries([row], capped=False)
    if len(whole) == 1:
        return whole[0].text
    return "\n\n".join(f"{_label(entry)}:\n{entry.text}" for entry in whole)


def _label(entry: Entry) -> str:
    return f"{entry.kind} {entry.tool}" if entry.tool else entry.kind


# -- wording -------------------------------------------------------------------------------


def _entries(rows: Iterable[asyncpg.Record], *, capped: bool = True) -> list[Entry]:
    """The entries of ``rows`` (oldest first); results name their call's tool, and calls
    without a result among them are pending."""
    out: list[Entry] = []
    tools: dict[str, str] = {}
    for row in rows:
        for entry in _of_message(row):
            if entry.kind == "call" and entry.call_id:
                tools[entry.call_id] = entry.tool or ""
            if entry.kind == "result" and entry.call_id in tools:
                entry = replace(entry, who=tools[entry.call_id], tool=tools[entry.call_id])
            out.append(_capped(entry) if capped else entry)
    answered = {entry.call_id for entry in out if entry.kind == "result"}
    return [
        replace(entry, pending=True)
        if entry.kind == "call" and entry.call_id not in answered
        else entry
        for entry in out
    ]


def _of_message(row: asyncpg.Record) -> list[Entry]:
    content = message_content(row["content"])
    at, message_id = row["created_at"], row["id"]
    if "compaction" in content:
        return [
            Entry("compacted", CONTROL_PLANE, _compaction(content["compaction"]), message_id, at)
        ]
    message = content.get("message") or {}
    role = message.get("role", row["role"])
    text = _text(message.get("content"))
    if role == "assistant":
        said = [Entry("said", WORKER, text, message_id, at)] if text.strip() else []
        return said + [
            Entry(
                "call",
                WORKER,
                canonical_arguments(call.get("function", {}).get("arguments")),
                message_id,
                at,
                tool=str(call.get("function", {}).get("name") or "?"),
                call_id=call.get("id"),
                form=call.get("form"),
            )
            for call in message.get("tool_calls") or []
        ]
    if role == "tool":
        shown, error = _result(text)
        return [
            Entry(
                "result",
                "tool",
                shown,
                message_id,
                at,
                call_id=message.get("tool_call_id"),
                error=error,
            )
        ]
    if row["seq"] == row["first_user"]:
        return [Entry("brief", CONTROL_PLANE, text, message_id, at)]
    if text.startswith(EVENTS_HEADER):
        # The header is the same paragraph every time; the records are what happened.
        return [
            Entry("events", CONTROL_PLANE, text[len(EVENTS_HEADER) :].lstrip("\n"), message_id, at)
        ]
    return [Entry("note", CONTROL_PLANE, text, message_id, at)]


def _text(content: Any) -> str:
    if content is None:
        return ""
    return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)


def _result(text: str) -> tuple[str, bool]:
    """A tool's result for people: a JSON object as ``key: value`` lines, a text with line
    breaks (a command's output) on lines of its own; and whether it is an error."""
    try:
        parsed = json.loads(text)
    except ValueError:
        return text, False
    if not isinstance(parsed, dict):
        return text, False
    lines: list[str] = []
    for key, value in parsed.items():
        if isinstance(value, str) and "\n" in value:
            lines.append(f"{key}:")
            lines.append(value.rstrip("\n"))
        elif isinstance(value, str):
            lines.append(f"{key}: {value}")
        else:
            lines.append(f"{key}: {json.dumps(value, ensure_ascii=False)}")
    return "\n".join(lines), "error" in parsed or "refused" in parsed


def _compaction(about: dict[str, Any]) -> str:
    before, after = about.get("tokens_before"), about.get("tokens_after")
    line = "context compacted" + (" (forced)" if about.get("forced") else "")
    if isinstance(before, int) and isinstance(after, int):
        line += f" from ~{before:,} to ~{after:,} tokens"
    steps = about.get("steps")
    if steps:
        line += f": {', '.join(str(step) for step in steps)}"
    summary = str(about.get("summary") or "")
    return f"{line}\n{summary}" if summary else line


def _capped(entry: Entry) -> Entry:
    if entry.kind == "call":
        shown, more = cap(entry.text, lines=1, chars=ARGS_CHARS)
    else:
        shown, more = cap(entry.text)
    return replace(entry, text=shown, more=more)


def cap(text: str, *, lines: int = LINES, chars: int = CHARS) -> tuple[str, str | None]:
    """``text`` cut to ``lines`` lines and ``chars`` characters, and what was left out
    ("37 more lines", or "1,204 more characters" within its last line); None when whole."""
    cut = -1
    for _ in range(lines):  # find, not a scan in Python: an output may be megabytes
        cut = text.find("\n", cut + 1)
        if cut < 0:
            cut = len(text)
            break
    cut = min(cut, chars)
    rest = text[cut:]
    if not rest.strip("\n"):
        return text, None
    rest = rest.removeprefix("\n")
    count = rest.count("\n") + (0 if rest.endswith("\n") else 1)
    if count > 1 or text[cut] == "\n":
        return text[:cut], f"{count:,} more line{'' if count == 1 else 's'}"
    return text[:cut], f"{len(rest):,} more character{'' if len(rest) == 1 else 's'}"
