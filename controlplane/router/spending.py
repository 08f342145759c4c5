"""What a router turn cost, on the tickets it acted on.

A router turn's model calls are the router session's (its row on the console's costs page);
a ticket's cost also counts the turns that concern it: the one that created it, and any
that later stopped, explained or forwarded to it. A turn that concerns several tickets is
split evenly between them; one that concerns none (a reply, an ignore) stays the router's
alone. Each call is priced by the router's model (:mod:`controlplane.llm.prices`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import asyncpg

from controlplane.llm.client import Answer, ToolCall
from controlplane.llm.prices import PRECISION
from controlplane.router.tools.core import ToolResult
from controlplane.tickets import store


@dataclass
class TurnSpend:
    tokens: int = 0
    dollars: Decimal = Decimal(0)
    tickets: dict[str, None] = field(default_factory=dict)  # in the order they came up

    def answered(self, answer: Answer) -> None:
        self.tokens += answer.usage.prompt_tokens + answer.usage.completion_tokens
        self.dollars += answer.cost_usd

    def acted(self, call: ToolCall, result: ToolResult) -> None:
        """The ticket an accepted call created or named, if any."""
        if not result.ok:
            return
        named: Any = result.content.get("ticket")
        if not isinstance(named, str):
            try:
                named = json.loads(call.arguments or "{}").get("ticket")
            except (ValueError, AttributeError):
                named = None
        if isinstance(named, str) and named.startswith("tkt_"):
            self.tickets[named] = None

    async def charge(self, pool: asyncpg.Pool) -> None:
        """The turn's tokens and dollars on its tickets' totals, split evenly."""
        if not self.tickets or not (self.tokens or self.dollars):
            return
        share = len(self.tickets)
        dollars = (self.dollars / share).quantize(PRECISION)
        async with pool.acquire() as conn, conn.transaction():
            for i, ticket in enumerate(self.tickets):
                tokens = self.tokens // share + (1 if i < self.tokens % share else 0)
                # The first takes what rounding left over, so the shares add up.
                extra = self.dollars - dollars * share if i == 0 else Decimal(0)
                await store.add_usage(conn, ticket, tokens, dollars + extra)
