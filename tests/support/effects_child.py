"""A runner in its own process, for tests that kill it mid-execution.

Usage: python -m tests.support.effects_child DSN MARKER_DIR LEASE_SECONDS
Its ``block`` handler writes MARKER_DIR/<effect id>.started and then never returns.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from controlplane.effects import ClaimedEffect, Handlers
from controlplane.effects.runner import EffectRunner
from controlplane.settings import EffectsSettings


async def main(dsn: str, markers: Path, lease: float) -> None:
    async def block(effect: ClaimedEffect) -> None:
        (markers / f"{effect.id}.started").write_text(str(effect.attempt))
        await asyncio.Event().wait()

    handlers = Handlers()
    handlers.register("block", block)
    runner = EffectRunner(dsn, handlers, EffectsSettings(lease_seconds=lease), owner="child")
    await runner.run()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])))
