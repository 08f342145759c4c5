"""Router batching: what batching every queued event into one turn buys as load grows.

Run by hand (never in CI)::

    python -m bench.router_batching [--rates 1,5,10,20,40] [--events 60] [--scale 20]

This reproduces the experiment behind the router's design. Events that need a decision
(explicit requests from an allowlisted user) arrive as a Poisson process at each rate
(events per minute). The real ``Router`` takes turns against the fake OpenAI-compatible
server (``tests/fakes/openai_server.py``) over the official ``openai`` client, on an
embedded Postgres, as the leader's ``RouterService`` does: one turn after another while
events wait, woken within a poll interval otherwise.

The fake model's latency grows with the prompt. A turn's first call takes
``FIXED + PER_TOKEN * (tokens of the batch message)``, calibrated so that a batch of one
event takes 2.5 s and each more event about 0.78 s (the paper: 2.5 s at batch size 1, 3.9 s
at 2.8). The model answers each thread with a ``reply`` (an explicit request is never
ignored), which decides every event on it. The follow-up call, which
reads the tool results, takes 10 % of that. ``--scale S`` divides every time, arrivals and
model latency alike, by ``S`` to keep the run short; reported times are scaled back up.

Reported per rate:
* mean batch size;
* time per request: the wall time of a turn, all its model calls included;
* amortized time per decision: the turns' total wall time divided by the decisions made;
* mean decision latency: from an event's arrival to the end of the turn that decided it;
* **router overhead per decision**: the turns' wall time outside model calls (the
  ``llm_calls.latency_ms`` the router records itself), divided by decisions. Not scaled:
  it is real time on this machine. Goal: ≤ 20 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import sys
import time
import warnings
from dataclasses import dataclass

import asyncpg

from bench.simdevice import (
    fresh_database,
    machine_summary,
    markdown_table,
    postgres_server,
    postgres_version,
)
from controlplane.db.pool import Db, create_pool
from controlplane.db.urls import asyncpg_dsn
from controlplane.ingest import admission
from controlplane.ingest.admission import Admission, SourceAdmission
from controlplane.ingest.intake import IncomingTrigger, Intake, ThreadRef
from controlplane.router.router import Router
from tests.fakes.openai_server import FAKE_MODEL, ChatRequest, FakeOpenAIServer, Reply
from tests.support.router_harness import ALICE, ignore_batch

ONE_EVENT_SECONDS = 2.5
PER_EXTRA_EVENT_SECONDS = 0.78
FOLLOW_UP_FRACTION = 0.1
POLL_SECONDS = 1.0  # the RouterService's poll when idle (scaled like everything else)


@dataclass
class RateResult:
    rate: float
    events: int
    turns: int
    mean_batch: float
    time_per_request: float
    per_decision: float
    latency: float
    overhead_ms: float
    overhead_p95_ms: float


class Calibrated:
    """Model latency from the batch message's size, fitted to the paper's two points."""

    def __init__(self, scale: float) -> None:
        self.scale = scale
        self.fixed = 0.0
        self.per_char = 0.0
        self.simulated: list[float] = []  # each call's model time, unscaled (seconds)

    def fit(self, one_event_chars: int, per_event_chars: float) -> None:
        self.per_char = PER_EXTRA_EVENT_SECONDS / per_event_chars
        self.fixed = ONE_EVENT_SECONDS - self.per_char * one_event_chars

    def __call__(self, request: ChatRequest) -> Reply:
        message = request.last_user_message() or ""
        seconds = self.fixed + self.per_char * len(message)
        last = request.last_message()
        if last is not None and last.get("role") == "tool":  # reading its tools' results
            seconds *= FOLLOW_UP_FRACTION
            self.simulated.append(seconds)
            return Reply(content="Done.", delay_ms=seconds * 1000 / self.scale)
        self.simulated.append(seconds)
        # Every event is an explicit request: one reply on each thread decides its events.
        return ignore_batch(request, delay_ms=seconds * 1000 / self.scale)


async def admit_alice(conn: Db) -> None:
    """The policy the router benches run under: alice (by her actor id) is allowlisted."""
    from controlplane.versions import POLICY, save

    await save(
        conn,
        POLICY,
        name=admission.POLICY_NAME,
        body=Admission(default=SourceAdmission(users=[ALICE.id])).model_dump(),
        base_id=None,
        author="bench",
    )


def _event(n: int, rate: float) -> IncomingTrigger:
    return IncomingTrigger(
        source="github",
        external_id=f"r{rate:g}-{n}",
        thread=ThreadRef(f"acme/app#{n % 7}", title="an issue"),
        actor=ALICE,
        kind="issue_comment",
        text=f"@superagent request number {n}: please look at the failing test in module "
        f"{n % 13} and tell me what you find.",
    )


async def _calibrate(url: str, fake: FakeOpenAIServer, model: Calibrated) -> None:
    """Measure the batch message's size for 1 and 5 events with the real renderer, on
    threads that already have earlier messages (as during the run)."""
    from controlplane.router import batch as batches

    pool = await create_pool(asyncpg_dsn(url))
    try:
        intake = Intake(pool)
        sizes = []
        for count in (1, 5):
            await pool.execute("DELETE FROM triggers")
            # As in the run: every thread already has earlier messages, shown as context.
            for n in range(14):
                await intake.ingest(_event(20_000 + n, count))
            await pool.execute("UPDATE triggers SET routed_at = now()")
            for n in range(count):
                await intake.ingest(_event(10_000 + n, count))
            sizes.append(len(batches.render(await batches.take(pool))))
        await pool.execute("DELETE FROM triggers")
        await pool.execute("DELETE FROM threads")
    finally:
        await pool.close()
    model.fit(sizes[0], (sizes[1] - sizes[0]) / 4)


async def _run_rate(
    url: str, fake: FakeOpenAIServer, model: Calibrated, rate: float, events: int, scale: float
) -> RateResult:
    pool = await create_pool(asyncpg_dsn(url), size=6)
    try:
        # The last rate's router session, calls, decisions and events, and what refers to
        # them (its session's messages, its replies): each rate starts from nothing.
        await pool.execute(
            "TRUNCATE router_decisions, llm_calls, sessions, triggers, threads CASCADE"
        )
        intake = Intake(pool)
        router = Router(
            pool, fake.async_openai_client(max_retries=0), FAKE_MODEL, policy=intake.policy
        )
        # Per turn: real wall time, decisions, and the slice of model calls it made.
        turns: list[tuple[float, int, slice]] = []

        async def arrive() -> None:
            rng = random.Random(int(rate * 1000))
            for n in range(events):
                await asyncio.sleep(rng.expovariate(rate / 60.0) / scale)
                await intake.ingest(_event(n, rate))

        async def route() -> None:
            decided = 0
            while decided < events:
                first_call = len(model.simulated)
                start = time.monotonic()
                count = await router.turn()
                if count:
                    calls = slice(first_call, len(model.simulated))
                    turns.append((time.monotonic() - start, count, calls))
                    decided += count
                else:
                    await asyncio.sleep(POLL_SECONDS / scale / 10)

        arriving = asyncio.create_task(arrive())
        await route()
        await arriving
        recorded = [
            row["latency_ms"] / 1000
            for row in await pool.fetch("SELECT latency_ms FROM llm_calls ORDER BY created_at, id")
        ]
        offset = turns[0][2].start if turns else 0
        requests = []  # full-scale time per turn: simulated model time + real overhead
        overheads = []  # real seconds per decision, per turn
        for wall, count, calls in turns:
            in_calls = sum(recorded[calls.start - offset : calls.stop - offset])
            overhead = wall - in_calls
            requests.append(sum(model.simulated[calls]) + overhead)
            overheads.append(overhead / count)
        decisions = sum(count for _, count, _ in turns)
        # Arrival to decision, by the database's own clock (created_at to routed_at).
        waited = await pool.fetchval(
            "SELECT avg(extract(epoch FROM routed_at - created_at)) FROM triggers"
        )
        overheads.sort()
        return RateResult(
            rate=rate,
            events=decisions,
            turns=len(turns),
            mean_batch=decisions / len(turns),
            time_per_request=statistics.mean(requests),
            per_decision=sum(requests) / decisions,
            latency=float(waited) * scale,
            overhead_ms=sum(
                wall - sum(recorded[c.start - offset : c.stop - offset]) for wall, _, c in turns
            )
            / decisions
            * 1000,
            overhead_p95_ms=overheads[int(0.95 * (len(overheads) - 1))] * 1000,
        )
    finally:
        await pool.close()


async def main(args: argparse.Namespace) -> None:
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    with postgres_server(args.database_url) as server_url:
        url = await fresh_database(server_url, "bench_router_batching")
        version = await postgres_version(url)
        for key, value in machine_summary(str(version)):
            print(f"- {key}: {value}")
        conn = await asyncpg.connect(asyncpg_dsn(url))
        try:
            await admit_alice(conn)
        finally:
            await conn.close()
        model = Calibrated(args.scale)
        with FakeOpenAIServer() as fake:
            await _calibrate(url, fake, model)
            print(
                f"- model: {model.fixed:.2f} s + {model.per_char * 1000:.2f} ms per character "
                f"of the batch message (scaled by 1/{args.scale:g} while running)"
            )
            fake.respond_with(model)
            results = []
            for rate in args.rates:
                print(f"rate {rate:g}/min: {args.events} events …", flush=True)
                results.append(await _run_rate(url, fake, model, rate, args.events, args.scale))
        print()
        print(
            markdown_table(
                [
                    "events/min",
                    "decisions",
                    "turns",
                    "mean batch size",
                    "time per request (s)",
                    "amortized time per decision (s)",
                    "mean decision latency (s)",
                    "router overhead per decision (ms, real)",
                    "p95 per turn (ms)",
                ],
                [
                    [
                        f"{r.rate:g}",
                        r.events,
                        r.turns,
                        f"{r.mean_batch:.2f}",
                        f"{r.time_per_request:.2f}",
                        f"{r.per_decision:.2f}",
                        f"{r.latency:.2f}",
                        f"{r.overhead_ms:.1f}",
                        f"{r.overhead_p95_ms:.1f}",
                    ]
                    for r in results
                ],
            )
        )


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.router_batching", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--rates", type=lambda s: [float(x) for x in s.split(",")], default=[1, 5, 10, 20, 40]
    )
    parser.add_argument("--events", type=int, default=60, help="events per rate")
    parser.add_argument("--scale", type=float, default=20.0, help="time compression factor")
    parser.add_argument("--database-url", help="a Postgres server (default: embedded pgserver)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(parse_args(sys.argv[1:])))
