"""The worker's tools on its ticket: ``report`` to the people who asked, handle threads
(``subscribe``, ``unsubscribe``), ``hand_back`` an event that is not its business, and
``recall`` an object, a job's output or a message of its session by id."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Annotated, Any, Literal, Self

from pydantic import Field, model_validator

from controlplane.db.pool import Db
from controlplane.errors import SuperagentError
from controlplane.ingest import inbox
from controlplane.llm import transcript
from controlplane.tickets import reports, subscriptions
from controlplane.tickets.recall import recall_thread, recall_ticket, recall_trigger
from controlplane.tools.fields import ID_CHARS, NON_BLANK, Arguments, ThreadId, TriggerId, id_of
from controlplane.tools.problems import rule_problem
from controlplane.tools.registry import Refused
from controlplane.workers.tools.core import Call, Limit, Offset, WorkerTools
from controlplane.workers.tools.device import read_job
from superagent_shared.ids import id_prefix

Status = Literal["progress", "ready", "question", "blocked", "failed"]
FINAL_STATUSES = frozenset({"ready", "question", "blocked", "failed"})

tools = WorkerTools()


class Report(Arguments):
    status: Status
    summary: Annotated[str, Field(max_length=20_000), NON_BLANK]
    question: Annotated[str | None, Field(max_length=5000)] = None
    pr_url: Annotated[str | None, Field(max_length=2000)] = None
    reproduced: bool | None = None
    fixed: bool | None = None

    @model_validator(mode="after")
    def _a_question_is_asked(self) -> Self:
        if self.status == "question" and not self.question:
            raise rule_problem("a question report needs the question")
        return self


@tools.tool(
    "report",
    "Report to the people who asked. progress: a note on record. ready: done (with the "
    "PR, if any). question: you need an answer. blocked / failed: you cannot go on. "
    "Any status but progress ends your turn. A speculative ticket must set reproduced "
    "and fixed when ready.",
)
async def report(call: Call, args: Report) -> dict[str, Any]:
    bench = call.bench
    confirmed = args.reproduced is True and args.fixed is True
    if bench.ticket.speculative and args.status == "ready" and confirmed:
        await reports.confirm_speculative(bench.pool, bench.ticket.id, args.summary)
        bench.ticket = replace(bench.ticket, speculative=False)
        return {
            "confirmed": True,
            "note": "reproduction and fix confirmed: your result is delivered now. "
            "Push the branch and open the pull request (open_pull_request), then "
            "report ready again.",
        }
    if args.status in FINAL_STATUSES and bench.outcome.held:
        raise Refused(
            "not reported: a call in this step is held for confirmation, so the ticket "
            "waits for people; report once it is answered"
        )
    if args.status in FINAL_STATUSES:
        bench.outcome.report = {
            "status": args.status,
            "summary": args.summary,
            "question": args.question or None,
            "pr_url": args.pr_url or None,
            "reproduced": args.reproduced is True,
            "fixed": args.fixed is True,
        }
        return {"reported": args.status, "note": "your turn ends here"}
    bench.outcome.report = None
    await reports.record_progress(bench.pool, bench.ticket.id, args.summary)
    return {"reported": "progress"}


class Thread(Arguments):
    thread: ThreadId


@tools.tool("subscribe", "Handle a thread: its events come to you.")
async def subscribe(call: Call, args: Thread) -> dict[str, Any]:
    return await _subscription(call, args.thread, subscriptions.subscribe, "subscribed")


@tools.tool("unsubscribe", "Stop handling a thread.")
async def unsubscribe(call: Call, args: Thread) -> dict[str, Any]:
    return await _subscription(call, args.thread, subscriptions.unsubscribe, "unsubscribed")


async def _subscription(
    call: Call, thread: str, change: Callable[[Db, str, str], Awaitable[None]], done: str
) -> dict[str, Any]:
    if not await call.bench.pool.fetchval("SELECT 1 FROM threads WHERE id = $1", thread):
        raise Refused(f"no thread {thread}")
    await change(call.bench.pool, call.bench.ticket.id, thread)
    return {done: thread}


class HandBack(Arguments):
    trigger: TriggerId


@tools.tool(
    "hand_back",
    "Give an event back that is not this ticket's business (the router decides on it).",
)
async def hand_back(call: Call, args: HandBack) -> dict[str, Any]:
    try:
        where = await inbox.hand_back(call.bench.pool, call.bench.ticket.id, args.trigger)
    except SuperagentError as exc:
        raise Refused(str(exc)) from None
    return {"handed_back": args.trigger, "now": where}


class Recall(Arguments):
    id: Annotated[str, Field(max_length=ID_CHARS), id_of("trg", "thr", "tkt", "cmd", "msg")]
    offset: Offset = None
    limit: Limit = None


@tools.tool(
    "recall",
    "Fetch an object by id (trg_, thr_, tkt_, a job's cmd_, or msg_: a message of this "
    "ticket's session, such as a tool output the context shows reduced). offset and "
    "limit: the slice of a job's output or a message's text.",
)
async def recall(call: Call, args: Recall) -> dict[str, Any]:
    prefix = id_prefix(args.id)
    if prefix == "cmd":
        return await read_job(call, args.id, args.offset, args.limit)
    if prefix == "msg":
        return await _recall_message(call, args)
    recaller = {"trg": recall_trigger, "thr": recall_thread, "tkt": recall_ticket}
    async with call.bench.pool.acquire() as conn:
        found = await recaller[prefix or ""](conn, args.id)
    if found is None:
        raise Refused(f"nothing with id {args.id}")
    return found


async def _recall_message(call: Call, args: Recall) -> dict[str, Any]:
    """A slice of a message of this ticket's sessions (what compaction reduced)."""
    offset = args.offset or 0
    limit = 8000 if args.limit is None else args.limit
    row = await call.bench.pool.fetchrow(
        "SELECT m.role, m.content FROM session_messages m "
        "JOIN sessions s ON s.id = m.session_id WHERE m.id = $1 AND s.ticket_id = $2",
        args.id,
        call.bench.ticket.id,
    )
    if row is None:
        raise Refused(f"no message {args.id} in this ticket's session")
    message = transcript.message_content(row["content"]).get("message") or {}
    content = message.get("content")
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    end = min(len(text), offset + limit)
    return {
        "id": args.id,
        "role": row["role"],
        "offset": offset,
        "content": text[offset:end],
        "size": len(text),
        **({"next_offset": end} if end < len(text) else {}),
    }
