"""The worker's tool on GitHub: ``open_pull_request`` from a pushed branch, through the
outbox (one pull request per ticket and branch, however often it is called)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from pydantic import Field

from controlplane.domain import EffectKind
from controlplane.effects.outbox import enqueue
from controlplane.tools.fields import NON_BLANK, Arguments
from controlplane.tools.registry import Refused
from controlplane.workers.tools.core import Call, WorkerTools

PR_WAIT_SECONDS = 30.0  # how long open_pull_request waits for the outbox to open it

tools = WorkerTools()

Name = Annotated[str | None, Field(max_length=300)]


class OpenPullRequest(Arguments):
    title: Annotated[str, Field(max_length=300), NON_BLANK]
    body: Annotated[str, Field(max_length=60_000)]
    head: Name = None
    base: Name = None
    repo: Name = None


@tools.tool(
    "open_pull_request",
    "Open a pull request from a pushed branch (idempotent: the open one from the same "
    "branch is returned). Its thread is then handled by this ticket.",
)
async def open_pull_request(call: Call, args: OpenPullRequest) -> dict[str, Any]:
    ticket, pool = call.bench.ticket, call.bench.pool
    if ticket.speculative:
        raise Refused(
            "this ticket is speculative: nothing is delivered until you report ready with "
            "reproduced=true and fixed=true; then you may open the pull request"
        )
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
    async with pool.acquire() as conn:
        # One pull request per ticket and branch, however often this is called.
        await enqueue(conn, EffectKind.OPEN_PULL_REQUEST, f"{ticket.id}:{head}", payload)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PR_WAIT_SECONDS
    while loop.time() < deadline:
        url = await pool.fetchval("SELECT pr_url FROM tickets WHERE id = $1", ticket.id)
        if url:
            return {"pull_request": url, "head": head, "base": payload["base"]}
        await asyncio.sleep(0.2)
    return {
        "pull_request": None,
        "note": "queued; GitHub has not answered yet. The URL arrives as an event.",
    }
