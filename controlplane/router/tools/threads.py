"""The router's tools over threads: reply on one, make a ticket handle one (``subscribe``:
its events go to the ticket) or note it as related (``link``: context only), and
``recall`` an object with its neighbours' ids (:mod:`controlplane.tickets.recall`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from pydantic import Field

from controlplane.db.pool import Conn, Db
from controlplane.domain import EffectKind
from controlplane.effects.outbox import enqueue
from controlplane.replies import IM_MAX_WORDS, Style, style_of, word_count
from controlplane.router.tools.core import (
    Call,
    Done,
    RouterTools,
    batch_on,
    live_ticket,
    thread_ids,
)
from controlplane.tickets import subscriptions
from controlplane.tickets.recall import recall_thread, recall_ticket, recall_trigger
from controlplane.tickets.reports import Spent
from controlplane.tools.fields import ID_CHARS, NON_BLANK, Arguments, ThreadId, TicketId, id_of
from controlplane.tools.registry import Refused
from superagent_shared.ids import id_prefix, new_id, stable_id

MAX_REPLY_CHARS = 20_000

tools = RouterTools()


class Reply(Arguments):
    thread: ThreadId
    text: Annotated[str, Field(max_length=MAX_REPLY_CHARS), NON_BLANK]


@tools.tool("reply", "Send a message on a thread (chat: short; GitHub: structured and complete).")
async def reply(call: Call, args: Reply) -> Done:
    conn, turn, thread_id = call.conn, call.turn, args.thread
    thread = await conn.fetchrow("SELECT source, external_id FROM threads WHERE id = $1", thread_id)
    if thread is None:
        raise Refused(f"no thread {thread_id}")
    words = word_count(args.text)
    if style_of(thread["source"]) is Style.im and words > IM_MAX_WORDS:
        raise Refused(
            f"{thread['source']} is a chat channel: at most {IM_MAX_WORDS} words, this "
            f"reply has {words}. Keep decisions, questions and results; put details in a "
            "GitHub comment or behind a link"
        )
    concerned = [
        row["id"]
        for row in await conn.fetch(
            "SELECT id FROM triggers WHERE id = ANY($1::text[]) AND thread_id = $2 "
            "ORDER BY created_at, id",
            list(turn.batch),
            thread_id,
        )
    ]
    text = args.text + await _spend_footer(conn, concerned, style_of(thread["source"]))
    # The n-th reply to a thread in a turn over its events has one id: a turn that runs
    # again after its leader died sends each of its replies once (outbound dedupe). Keyed
    # by the thread's own oldest event in the batch, not the batch's first: the rerun's
    # batch may start elsewhere (an event committed late with an earlier time, or this
    # event retried alone after a failed turn). Those events are not routed yet, so no
    # other turn can share the key.
    this_turn = turn.key
    nth = call.replies.nth(this_turn, thread_id)
    anchor = concerned[0] if concerned else this_turn
    reply_id = stable_id("msg", f"reply:{anchor}:{thread_id}:{nth}") if anchor else new_id("msg")
    await enqueue(
        conn,
        EffectKind.REPLY,
        reply_id,  # the outbound message's dedupe key: sent once however often retried
        {
            "reply_id": reply_id,
            "thread_id": thread_id,
            "source": thread["source"],
            "thread_external_id": thread["external_id"],
            "text": text,
        },
    )
    return Done({"queued": reply_id}, f"reply {reply_id} queued on {thread_id}", concerned)


async def _spend_footer(conn: Conn, trigger_ids: list[str], style: Style) -> str:
    """Every reply about a worker's result states what the ticket spent, whatever the
    model wrote (the numbers come from the reports, not from the model)."""
    rows = await conn.fetch(
        "SELECT DISTINCT ON (ticket_id) ticket_id, tokens, cost_usd FROM reports "
        "WHERE trigger_id = ANY($1::text[]) ORDER BY ticket_id, created_at DESC",
        trigger_ids,
    )
    parts = [f"{r['ticket_id']}: {Spent(r['tokens'], r['cost_usd']).line()}" for r in rows]
    if not parts:
        return ""
    if style is Style.structured:
        return "\n\n<sub>" + "; ".join(parts) + "</sub>"
    return " (" + "; ".join(parts) + ")"


class Relate(Arguments):
    thread: ThreadId
    ticket: TicketId


@tools.tool(
    "subscribe", "Make a ticket handle a thread: the thread's events go to the ticket's worker."
)
async def subscribe(call: Call, args: Relate) -> Done:
    return await _relate(call, args, subscriptions.subscribe, "subscribed")


@tools.tool(
    "link", "Note that a thread is related to a ticket (context only; no events delivered)."
)
async def link(call: Call, args: Relate) -> Done:
    return await _relate(call, args, subscriptions.link, "linked")


async def _relate(
    call: Call, args: Relate, relate: Callable[[Db, str, str], Awaitable[None]], done: str
) -> Done:
    await thread_ids(call.conn, [args.thread])
    await live_ticket(call.conn, args.ticket)
    await relate(call.conn, args.ticket, args.thread)
    concerned = await batch_on(call.conn, call.turn, [args.thread])
    return Done({done: True}, f"{args.thread} {done} to {args.ticket}", concerned)


class Recall(Arguments):
    id: Annotated[str, Field(max_length=ID_CHARS), id_of("trg", "thr", "tkt")]


@tools.tool("recall", "Fetch an object (trigger, thread, ticket) by ID, with its neighbours' IDs.")
async def recall(call: Call, args: Recall) -> Done:
    recaller = {"trg": recall_trigger, "thr": recall_thread, "tkt": recall_ticket}
    found = await recaller[id_prefix(args.id) or ""](call.conn, args.id)
    if found is None:
        raise Refused(f"nothing with id {args.id}")
    return Done(found, f"recalled {args.id}", [])
