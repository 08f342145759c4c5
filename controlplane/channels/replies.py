"""Sending the router's replies (outbox kind ``reply``), per channel.

No channel sends replies yet (the adapters come with the channels issue), so a reply waits
in the outbox, postponed hourly, instead of failing until it is dead: once an adapter
exists, the replies queued before it go out.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from controlplane.effects.handlers import ClaimedEffect, Postpone
from controlplane.pause import hold_while_paused

WAIT_FOR_ADAPTER_SECONDS = 3600.0


def reply_handler(pool: asyncpg.Pool) -> Any:
    async def send(effect: ClaimedEffect) -> None:
        await hold_while_paused(pool)
        source = effect.payload.get("source", "?")
        raise Postpone(WAIT_FOR_ADAPTER_SECONDS, f"no adapter sends {source} replies yet")

    return send
