"""The worker's tools on GitHub, both through the outbox:

* ``open_pull_request`` from a pushed branch. A ticket has one pull request: once it has
  one (or one is being opened), the call returns it and says so, and queues nothing; new
  commits pushed to the ticket's branch appear on it.
* ``reply_to_comment``: answer a comment on a GitHub thread the ticket handles where it
  was made: a review comment in its review thread, anything else on its issue or pull
  request.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Annotated, Any

import asyncpg
from pydantic import Field

from controlplane.domain import EffectKind
from controlplane.effects.outbox import enqueue
from controlplane.replies import enqueue_reply
from controlplane.tools.fields import NON_BLANK, Arguments, TriggerId
from controlplane.tools.registry import Refused
from controlplane.workers.tools.core import Call, WorkerTools
from superagent_shared.ids import stable_id

PR_WAIT_SECONDS = 30.0  # how long open_pull_request waits for the outbox to open it
REVIEW_COMMENT = "pull_request_review_comment:"  # its triggers' external ids (events.py)

tools = WorkerTools()

Name = Annotated[str | None, Field(max_length=300)]


class OpenPullRequest(Arguments):
    title: Annotated[str, Field(max_length=300), NON_BLANK]
    body: Annotated[str, Field(max_length=60_000)]
    head: Name = None
    base: Name = None
    repo: Name = None


# An open_pull_request effect of the ticket's not yet done (nor given up on): its head.
_OPENING = (
    "SELECT payload->>'head' FROM effects WHERE kind = $1 AND payload->>'ticket_id' = $2 "
    "AND dead_at IS NULL ORDER BY created_at LIMIT 1"
)


@tools.tool(
    "open_pull_request",
    "Open this ticket's pull request from a pushed branch. A ticket has one: if it has "
    "one already, it is returned and nothing new is opened (push new commits to its branch "
    "and they appear on it). Its thread is then handled by this ticket.",
)
async def open_pull_request(call: Call, args: OpenPullRequest) -> dict[str, Any]:
    ticket, pool = call.bench.ticket, call.bench.pool
    if ticket.speculative:
        raise Refused(
            "this ticket is speculative: nothing is delivered until you report ready with "
            "reproduced=true and fixed=true; then you may open the pull request"
        )
    existing = await pool.fetchval("SELECT pr_url FROM tickets WHERE id = $1", ticket.id)
    if existing:
        return _existing(existing, ticket.branch)
    repo = args.repo or ticket.repo
    if not repo or "/" not in repo:
        raise Refused("name the repository (owner/name): this ticket has none")
    head = args.head or ticket.branch
    if not head:
        raise Refused("name the branch (head) you pushed")
    payload = {
        "repo": repo,
        "head": head,
        "base": args.base or "main",
        "title": args.title,
        "body": args.body,
        "ticket_id": ticket.id,
    }
    async with pool.acquire() as conn, conn.transaction():
        opening = await conn.fetchval(_OPENING, EffectKind.OPEN_PULL_REQUEST, ticket.id)
        if opening is None:
            # One pull request per ticket and branch, however often this is called.
            await enqueue(conn, EffectKind.OPEN_PULL_REQUEST, f"{ticket.id}:{head}", payload)
        else:
            head = opening  # already on its way: that one is the ticket's, wait for it
    url = await _opened(pool, ticket.id)
    if url:
        return {"pull_request": url, "head": head, "base": payload["base"]}
    return {
        "pull_request": None,
        "note": "queued; GitHub has not answered yet. The URL arrives as an event.",
    }


def _existing(url: str, branch: str | None) -> dict[str, Any]:
    where = f" ({branch})" if branch else ""
    return {
        "pull_request": url,
        "existing": True,
        "note": f"this ticket already has its pull request: nothing new was opened. Push new "
        f"commits to its branch{where} and they appear on it.",
    }


async def _opened(pool: asyncpg.Pool, ticket_id: str) -> str | None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PR_WAIT_SECONDS
    while loop.time() < deadline:
        url = await pool.fetchval("SELECT pr_url FROM tickets WHERE id = $1", ticket_id)
        if url:
            return str(url)
        await asyncio.sleep(0.2)
    return None


class ReplyToComment(Arguments):
    trigger: TriggerId
    text: Annotated[str, Field(max_length=60_000), NON_BLANK]


@tools.tool(
    "reply_to_comment",
    "Answer an event of this ticket's on GitHub where it was made: a review comment gets "
    "its reply in its review thread, a review or comment a comment on the pull request or "
    "issue. trigger: the event's trg_ id. To tell the people who asked, use report.",
)
async def reply_to_comment(call: Call, args: ReplyToComment) -> dict[str, Any]:
    ticket, pool = call.bench.ticket, call.bench.pool
    if ticket.speculative:
        raise Refused("this ticket is speculative: it says nothing until it delivers")
    event = await pool.fetchrow(
        "SELECT g.thread_id, g.external_id, th.source FROM ticket_inbox i "
        "JOIN triggers g ON g.id = i.trigger_id JOIN threads th ON th.id = g.thread_id "
        "WHERE i.ticket_id = $1 AND i.trigger_id = $2",
        ticket.id,
        args.trigger,
    )
    if event is None:
        raise Refused(f"{args.trigger} is not an event this ticket received")
    if event["source"] != "github":
        raise Refused(
            f"{args.trigger} is from {event['source']}: only GitHub comments are answered "
            "in place; tell people elsewhere through report"
        )
    in_review = str(event["external_id"]).startswith(REVIEW_COMMENT)
    # The same answer to the same event is one reply, even if a resumed round repeats it.
    digest = hashlib.sha256(args.text.encode()).hexdigest()[:16]
    reply_id = stable_id("msg", f"worker-reply:{ticket.id}:{args.trigger}:{digest}")
    async with pool.acquire() as conn, conn.transaction():
        queued = await enqueue_reply(
            conn,
            event["thread_id"],
            args.text,
            reply_id,
            reply_to=event["external_id"] if in_review else None,
        )
    return {
        "replied": args.trigger,
        "where": "in its review thread" if in_review else "on its thread",
        **({} if queued else {"note": "this answer was sent already"}),
    }
