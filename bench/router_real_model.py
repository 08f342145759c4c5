"""The router with a real model: batching as load grows, and the share of the prompt served
from the model server's cache.

Run by hand (never in CI), once ``scripts/real_model`` has cached the model and server::

    python -m bench.router_real_model [--rates 2,6,20] [--events 8]

``bench.router_batching`` measures the same curve with a scripted model whose latency is
fitted to the paper's two points. Here nothing is scripted: Qwen2.5-Coder-1.5B-Instruct
in llama.cpp's ``llama-server`` (two slots of 8,192 tokens, 2 threads: this machine's
small-model setup, ``tests/support/real_model.py``) decides each batch, through the real
``Router`` on an embedded Postgres, in real time. Explicit questions from an allowlisted
person (each answered by a reply) arrive as a Poisson process at each rate (events per
minute) on 7 GitHub threads that already have earlier messages. A turn that fails goes
through the router service's own containment (the event tried alone, then set aside), as
in production.

Reported per rate:

* decided events, undecidable ones, turns and failed turns;
* mean batch size (events per turn that decided something);
* time per turn (wall time, its model calls included) and amortized time per decided event;
* mean decision latency (arrival to decision, by the database's clock);
* the router's own time per decided event outside its model calls;
* the prompt tokens served from the server's cache: over all calls, and over every call but
  the session's first (its cold prompt), which is the figure the prefix's stability buys.

A small model on 2 CPU cores is slow (a cold prompt of ~2,000 tokens takes 20 to 70 s), so
each rate waits for its last event until ``--settle-minutes`` after the last arrival.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import openai

from bench.router_batching import admit_alice
from bench.simdevice import (
    fresh_database,
    machine_summary,
    markdown_table,
    postgres_server,
    postgres_version,
)
from controlplane.db.pool import create_pool
from controlplane.db.urls import asyncpg_dsn
from controlplane.ingest.intake import IncomingTrigger, Intake, ThreadRef
from controlplane.router.containment import Containment
from controlplane.router.router import Router, TurnFailed
from controlplane.settings import LlmSettings, RouterSettings
from tests.support.router_harness import ALICE

THREADS = 7
IDLE_POLL = 0.5  # seconds between looks at an empty inbox


@dataclass
class RateResult:
    rate: float
    decided: int
    undecidable: int
    turns: int
    failed_turns: int
    mean_batch: float
    per_turn: float
    per_decision: float
    latency: float
    overhead_ms: float
    cached_all: float
    cached_warm: float
    prompt_tokens: int


def _event(n: int, rate: float) -> IncomingTrigger:
    return IncomingTrigger(
        source="github",
        external_id=f"real-r{rate:g}-{n}",
        thread=ThreadRef(f"acme/app#{n % THREADS}", title=f"issue {n % THREADS}"),
        actor=ALICE,
        kind="issue_comment",
        # A question a reply answers: the bench has no device, so work the model files as a
        # ticket is refused, and a failed turn takes its events alone (no batching left).
        text=f"@superagent quick question {n}: what does the error 'connect ECONNREFUSED "
        f"127.0.0.1:{5000 + n}' usually mean?",
    )


async def _earlier_messages(intake: Intake, pool: asyncpg.Pool, rate: float) -> list[str]:
    """Each thread's earlier messages, already routed: the context a batch shows."""
    ids = [(await intake.ingest(_event(50_000 + n, rate))).trigger_id for n in range(2 * THREADS)]
    await pool.execute("UPDATE triggers SET routed_at = now()")
    return ids


async def _run_rate(
    pool: asyncpg.Pool,
    client: openai.AsyncOpenAI,
    model: str,
    rate: float,
    events: int,
    settle_minutes: float,
) -> RateResult:
    await pool.execute("TRUNCATE router_decisions, llm_calls, sessions, triggers, threads CASCADE")
    intake = Intake(pool)
    earlier = await _earlier_messages(intake, pool, rate)
    llm = LlmSettings(router_context_tokens=8192, attempts=2)
    router = Router(pool, client, model, policy=intake.policy, llm=llm)
    containment = Containment(pool, RouterSettings(), admin_thread=None)
    turns: list[tuple[float, int]] = []  # (wall seconds, events decided) per turn
    failed = 0
    arrived = asyncio.Event()

    async def arrive() -> None:
        rng = random.Random(int(rate * 1000))
        for n in range(events):
            await asyncio.sleep(rng.expovariate(rate / 60.0))
            await intake.ingest(_event(n, rate))
        arrived.set()

    async def waiting() -> int:
        return int(
            await pool.fetchval(
                "SELECT count(*) FROM triggers WHERE routed_at IS NULL AND route = 'router'"
            )
        )

    arriving = asyncio.create_task(arrive())
    deadline: float | None = None
    while True:
        if arrived.is_set() and deadline is None:
            deadline = time.monotonic() + settle_minutes * 60
        if arrived.is_set() and not await waiting():
            break
        if deadline is not None and time.monotonic() > deadline:
            print(f"  {await waiting()} events still waiting at the deadline", flush=True)
            break
        start = time.monotonic()
        try:
            count = await router.turn()
        except TurnFailed as failure:
            failed += 1
            await containment.failed(failure, 0)
            print(f"  a turn failed: {str(failure.cause)[:160]}", flush=True)
            continue
        if count:
            turns.append((time.monotonic() - start, count))
            print(f"  turn: {count} event(s) in {turns[-1][0]:.1f} s", flush=True)
        else:
            await asyncio.sleep(IDLE_POLL)
    arriving.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await arriving
    return await _result(pool, rate, turns, failed, earlier)


async def _result(
    pool: asyncpg.Pool, rate: float, turns: list[tuple[float, int]], failed: int, earlier: list[str]
) -> RateResult:
    row = await pool.fetchrow(
        "SELECT count(*) FILTER (WHERE routed_at IS NOT NULL AND undecidable_at IS NULL) "
        "AS decided, count(*) FILTER (WHERE undecidable_at IS NOT NULL) AS undecidable, "
        "avg(extract(epoch FROM routed_at - created_at)) FILTER (WHERE undecidable_at IS NULL "
        "AND routed_at IS NOT NULL) AS latency "
        "FROM triggers WHERE route = 'router' AND id <> ALL($1::text[])",
        earlier,
    )
    calls = await pool.fetch(
        "SELECT prompt_tokens, cached_tokens, latency_ms FROM llm_calls WHERE outcome = 'ok' "
        "ORDER BY created_at, id"
    )
    assert row is not None
    decided = int(row["decided"])
    in_calls = sum(c["latency_ms"] for c in calls) / 1000
    wall = sum(seconds for seconds, _ in turns)
    prompt = sum(c["prompt_tokens"] for c in calls)
    warm = calls[1:]
    warm_prompt = sum(c["prompt_tokens"] for c in warm)
    return RateResult(
        rate=rate,
        decided=decided,
        undecidable=int(row["undecidable"]),
        turns=len(turns),
        failed_turns=failed,
        mean_batch=sum(n for _, n in turns) / len(turns) if turns else 0.0,
        per_turn=statistics.mean(s for s, _ in turns) if turns else 0.0,
        per_decision=wall / decided if decided else 0.0,
        latency=float(row["latency"] or 0.0),
        overhead_ms=max(0.0, wall - in_calls) / decided * 1000 if decided else 0.0,
        cached_all=sum(c["cached_tokens"] for c in calls) / prompt if prompt else 0.0,
        cached_warm=sum(c["cached_tokens"] for c in warm) / warm_prompt if warm_prompt else 0.0,
        prompt_tokens=prompt,
    )


async def main(args: argparse.Namespace) -> None:
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    from tests.support import real_model  # the model server from scripts/real_model's cache

    with (
        tempfile.TemporaryDirectory() as tmp,
        real_model.running(Path(tmp) / "server.log") as server,
        postgres_server(args.database_url) as server_url,
    ):
        url = await fresh_database(server_url, "bench_router_real_model")
        for key, value in machine_summary(str(await postgres_version(url))):
            print(f"- {key}: {value}")
        print(f"- model: {real_model.ALIAS} in llama-server, {server.window}-token slots")
        pool = await create_pool(asyncpg_dsn(url), size=6)
        try:
            await admit_alice(pool)
            client = openai.AsyncOpenAI(base_url=server.url, api_key="local", max_retries=0)
            results = []
            for rate in args.rates:
                print(f"rate {rate:g}/min: {args.events} events …", flush=True)
                results.append(
                    await _run_rate(
                        pool, client, real_model.ALIAS, rate, args.events, args.settle_minutes
                    )
                )
        finally:
            await pool.close()
    print()
    print(_table(results))


def _table(results: Sequence[RateResult]) -> str:
    return markdown_table(
        [
            "events/min",
            "decided",
            "undecidable",
            "turns (failed)",
            "mean batch size",
            "time per turn (s)",
            "amortized time per decided event (s)",
            "mean decision latency (s)",
            "router's own time per decided event (ms)",
            "prompt tokens",
            "served from cache: all calls / after the first",
        ],
        [
            [
                f"{r.rate:g}",
                r.decided,
                r.undecidable,
                f"{r.turns} ({r.failed_turns})",
                f"{r.mean_batch:.2f}",
                f"{r.per_turn:.1f}",
                f"{r.per_decision:.1f}",
                f"{r.latency:.1f}",
                f"{r.overhead_ms:.0f}",
                r.prompt_tokens,
                f"{r.cached_all:.0%} / {r.cached_warm:.0%}",
            ]
            for r in results
        ],
    )


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.router_real_model", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--rates",
        type=lambda s: [float(x) for x in s.split(",")],
        default=[2, 6, 20],
        help="arrival rates, events per minute (default 2,6,20)",
    )
    parser.add_argument("--events", type=int, default=8, help="events per rate (default 8)")
    parser.add_argument(
        "--settle-minutes",
        type=float,
        default=15.0,
        help="how long after the last arrival a rate may take to decide everything",
    )
    parser.add_argument("--database-url", help="a Postgres server (default: embedded pgserver)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(parse_args(sys.argv[1:])))
