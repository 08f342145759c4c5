"""Is a long-running worker still on its ticket's goal? The model's judgement, asked
at most every ``drift_seconds`` per ticket, from the scope and the worker's recent calls.

The watchdog has its own session (kind ``watchdog``) so its calls are accounted for like
every other model call. An answer that is not the expected JSON counts as "on goal": the
watchdog must never stop or nudge on a garbled reply.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import timedelta
from typing import Any

import asyncpg
import openai

from controlplane import prompts
from controlplane.findings import Seen
from controlplane.llm import Accounting, LlmClient, LlmError, sessions, transcript
from controlplane.settings import Settings

log = logging.getLogger(__name__)

RECENT_CALLS = 12
QUESTION = (
    "Ticket {ticket}: {title}\nScope: {scope}\n\nThe worker's most recent tool calls, oldest "
    "first:\n{calls}\n\nIs the worker still working toward this ticket's goal, within its "
    'scope? Answer with JSON only: {{"on_goal": true or false, "why": "one sentence"}}.'
)


class DriftCheck:
    def __init__(self, pool: asyncpg.Pool, client: openai.AsyncOpenAI, settings: Settings) -> None:
        self.pool = pool
        self.llm = LlmClient(pool, client, settings.llm)
        self.model = settings.llm.router_model
        self.every = timedelta(seconds=settings.watchdog.drift_seconds)
        self.session_id: str | None = None
        self.asked: dict[str, float] = {}  # ticket -> monotonic time of the last question

    async def check(self) -> list[Seen]:
        rows = await self.pool.fetch(
            "SELECT a.ticket_id, a.session_id, t.title, "
            "(SELECT scope FROM mandates m WHERE m.ticket_id = t.id ORDER BY m.created_at "
            " LIMIT 1) AS scope "
            "FROM assignments a JOIN tickets t ON t.id = a.ticket_id "
            "WHERE a.ended_at IS NULL AND t.state = 'running' AND a.session_id IS NOT NULL "
            "AND a.created_at < now() - $1::interval",
            self.every,
        )
        seen = []
        now = time.monotonic()
        for row in rows:
            last = self.asked.get(row["ticket_id"])
            if last is not None and now - last < self.every.total_seconds():
                continue
            self.asked[row["ticket_id"]] = now
            verdict = await self._ask(row)
            if verdict is not None and verdict.get("on_goal") is False:
                seen.append(
                    Seen(
                        "drift",
                        row["ticket_id"],
                        "warning",
                        str(verdict.get("why") or "off its ticket's goal")[:500],
                    )
                )
        return seen

    async def _ask(self, row: asyncpg.Record) -> dict[str, Any] | None:
        calls = await self.pool.fetch(
            "SELECT content FROM session_messages WHERE session_id = $1 AND role = 'assistant' "
            "ORDER BY seq DESC LIMIT $2",
            row["session_id"],
            RECENT_CALLS,
        )
        lines = []
        for call_row in reversed(calls):
            message = transcript.message_content(call_row["content"])["message"]
            for call in message.get("tool_calls") or []:
                lines.append("- " + transcript.canonical_call(call)[:300])
        if not lines:
            return None
        question = QUESTION.format(
            ticket=row["ticket_id"], title=row["title"], scope=row["scope"], calls="\n".join(lines)
        )
        session_id = await self._session()
        try:
            answer = await self.llm.complete(
                model=self.model,
                messages=[
                    {"role": "system", "content": prompts.DEFAULTS["watchdog"]},
                    {"role": "user", "content": question},
                ],
                # On the ticket's totals: its cost counts the watchdog's look at it too.
                accounting=Accounting(session_id, ticket_id=row["ticket_id"]),
                max_tokens=self.llm.settings.watchdog_max_tokens,
            )
        except LlmError as exc:
            log.warning("watchdog: drift check of %s failed (%s)", row["ticket_id"], exc)
            return None
        try:
            verdict = json.loads(answer.content or "")
        except json.JSONDecodeError:
            return None
        return verdict if isinstance(verdict, dict) else None

    async def _session(self) -> str:
        if self.session_id is None:
            self.session_id = await sessions.start(self.pool, "watchdog", self.model)
        return self.session_id
