"""Ablation: the two-tier design against itself without pass-through and a single session.

Run by hand (never in CI)::

    python -m bench.ablation [--runs 5] [--designs two_tier,no_pass_through,single_session]
                             [--scale 30] [--max-workers 6] [--json results.json]

A replay of the end-to-end experiment in the paper behind this design, on the real code:
the real ``Intake`` (policy, pass-through), the real ``Router`` (batching, tools,
compaction), the real ``WorkerService`` (slots, leases, asynchronous ReAct, reports) and the
real command queue, on an embedded Postgres. What is simulated:

* **The models**: the fake OpenAI-compatible server answers as a competent model would
  (the router creates tickets for requests, relays reports, replies to chat, forwards or
  stops what it must; the worker starts the task, waits for it, reports). Each answer's
  latency grows with the prompt: ``fixed + per_token * prompt tokens`` (router 2 s +
  0.25 ms/token, worker 4 s + 0.4 ms/token, simulated), and the server's prefix cache
  reports cached tokens as a provider's would.
* **The work**: a task only consumes time. The worker runs ``sleep`` for the task's
  duration (9 to 13 simulated minutes) on a device that runs real subprocesses.
* **Time**: everything is divided by ``--scale`` (arrivals, model latency, task
  durations, the workers' foreground wait and polls); reported times are scaled back.

Workload per run (seeded, the same for every design): 20 task requests on their own issue
threads over the first hour, then follow-ups from people (60) and CI results (60) on those
threads while the tasks run, 2 cancellations (``/stop``), and casual chat (about 160, a
third of it addressed to the agent) on other threads: about 300 messages.

Designs:

* ``two_tier``: this system. Thread events go straight to their ticket's worker.
* ``no_pass_through``: the same, with ``router.pass_through`` off: every thread event
  reaches the router, which forwards it to the ticket (or stops it).
* ``single_session``: the baseline (``workers.design = single_session``): one session sees
  everything and runs each task inside a ``subagent`` tool call, waiting for it.

Reported per design (mean over runs, and per run in ``--json``): task completion p50 and
p95 (a request's arrival to the reply that delivers its result, simulated minutes),
p95/p50, router decisions, and the router session's prompt and cached tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import random
import re
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import asyncpg

from bench.simdevice import (
    fresh_database,
    machine_summary,
    markdown_table,
    postgres_server,
    postgres_version,
)
from controlplane.db.pool import create_pool
from controlplane.db.urls import asyncpg_dsn
from controlplane.gateway.delivery import CommandDelivery
from controlplane.gateway.queue import CommandQueue
from controlplane.ingest.admission import Actor, Admission, SourceAdmission
from controlplane.ingest.intake import IncomingTrigger, Intake, ThreadRef
from controlplane.router.router import Router
from controlplane.settings import Settings, WorkerSettings
from controlplane.workers import service as worker_service
from controlplane.workers import worker as worker_module
from controlplane.workers.service import WorkerService
from controlplane.workers.subagent import Subagent
from tests.fakes.openai_server import (
    FAKE_API_KEY,
    FAKE_MODEL,
    ChatRequest,
    FakeOpenAIServer,
    ToolCall,
)
from tests.fakes.openai_server import Reply as ModelReply
from tests.support.worker_harness import LocalDevice

DESIGNS = ("two_tier", "no_pass_through", "single_session")
PEOPLE = ("alice", "bob", "carol", "dave")
TASKS = 20
FOLLOW_UPS = 60
CI_RESULTS = 60
CANCELLATIONS = 2
CHAT = 160
TASK_WINDOW_MINUTES = 60.0
ROUTER_MODEL = (2.0, 0.25 / 1000)  # seconds, seconds per prompt token (simulated)
WORKER_MODEL = (4.0, 0.4 / 1000)
CHARS_PER_TOKEN = 4
TRIGGER = re.compile(r"\[(trg_\w+)\] (\w+) ([\w.]+) from ([\w-]+)")
THREAD = re.compile(r"^thread (thr_\w+) .*?(?:handled by (tkt_\w+))?$")


@dataclasses.dataclass(frozen=True)
class Message:
    at: float  # simulated minutes from the start
    thread: str
    actor: str
    text: str
    kind: str = "issue_comment"
    task: int | None = None  # the task this message asks for (requests only)


def workload(seed: int) -> list[Message]:
    """About 300 messages: 20 requests with their follow-ups, CI, cancellations, chat."""
    rng = random.Random(seed)
    out: list[Message] = []
    starts = sorted(rng.uniform(0, TASK_WINDOW_MINUTES) for _ in range(TASKS))
    durations = [rng.uniform(9, 13) for _ in range(TASKS)]
    for n, (start, minutes) in enumerate(zip(starts, durations, strict=True)):
        out.append(
            Message(
                start,
                f"acme/app#{n + 1}",
                PEOPLE[n % len(PEOPLE)],
                f"@superagent please fix issue {n + 1} (work: {minutes:.2f} minutes)",
                task=n,
            )
        )
    for index in range(FOLLOW_UPS):
        n = index % TASKS
        out.append(
            Message(
                starts[n] + rng.uniform(1, durations[n]),
                f"acme/app#{n + 1}",
                PEOPLE[(n + 1) % len(PEOPLE)],
                rng.choice(
                    [
                        "also keep the old behaviour for empty input",
                        "any news on this?",
                        "the same happens on the staging branch",
                        "note: the fixture file moved last week",
                    ]
                ),
            )
        )
    for index in range(CI_RESULTS):
        n = index % TASKS
        out.append(
            Message(
                starts[n] + rng.uniform(0.5, durations[n]),
                f"acme/app#{n + 1}",
                "ci-bot",
                rng.choice(["CI: build passed", "CI: 1 test failed (test_edge)", "CI: lint ok"]),
                kind="check_run.completed",
            )
        )
    for n in rng.sample(range(TASKS), CANCELLATIONS):
        out.append(
            Message(
                starts[n] + 2.0, f"acme/app#{n + 1}", PEOPLE[n % len(PEOPLE)], "@superagent /stop"
            )
        )
    for _ in range(CHAT):
        addressed = rng.random() < 0.33
        text = rng.choice(["lunch at noon?", "the deploy went fine", "who has the on-call?"])
        out.append(
            Message(
                rng.uniform(0, TASK_WINDOW_MINUTES + 15),
                f"acme/chat#{rng.randint(1, 5)}",
                rng.choice(PEOPLE),
                f"@superagent {text}" if addressed else text,
            )
        )
    return sorted(out, key=lambda m: m.at)


def _duration(text: str) -> float:
    found = re.search(r"work: ([\d.]+) minutes", text)
    return float(found[1]) if found else 10.0


class Models:
    """Both simulated models, answering from what each request shows."""

    def __init__(self, scale: float, single: bool) -> None:
        self.scale = scale
        self.single = single
        self.pending_subagents: dict[str, str] = {}  # tool call id -> thread

    def _delay_ms(self, request: ChatRequest, model: tuple[float, float]) -> float:
        tokens = len(json.dumps(request.body)) / CHARS_PER_TOKEN
        return (model[0] + model[1] * tokens) * 1000 / self.scale

    def __call__(self, request: ChatRequest) -> ModelReply:
        if (request.system_prompt() or "").startswith("You are the router"):
            reply = self.route(request)
            return dataclasses.replace(reply, delay_ms=self._delay_ms(request, ROUTER_MODEL))
        reply = self.work(request)
        return dataclasses.replace(reply, delay_ms=self._delay_ms(request, WORKER_MODEL))

    def route(self, request: ChatRequest) -> ModelReply:
        last = request.last_message() or {}
        if last.get("role") == "tool":
            # Only the baseline reads results: a subagent's report to pass on.
            replies = []
            for message in request.messages[::-1]:
                if message.get("role") != "tool":
                    break
                thread = self.pending_subagents.pop(str(message.get("tool_call_id")), None)
                if thread is not None:
                    replies.append(ToolCall("reply", {"thread": thread, "text": "Done."}))
            return ModelReply(tool_calls=replies) if replies else ModelReply(content="Done.")
        calls: list[ToolCall] = []
        thread = ticket = None
        for line in (request.last_user_message() or "").splitlines():
            if found := THREAD.match(line):
                thread, ticket = found[1], found[2]
                continue
            found = TRIGGER.search(line)
            if found is None:
                continue
            trigger, verdict, kind = found[1], found[2], found[3]
            text = line.split(": ", 1)[-1]
            if kind.startswith("report."):
                calls.append(ToolCall("reply", {"thread": thread, "text": "Done, see above."}))
            elif "/stop" in text and ticket:
                calls.append(ToolCall("stop_ticket", {"ticket": ticket, "reason": "asked"}))
            elif ticket:
                calls.append(ToolCall("forward", {"trigger": trigger, "ticket": ticket}))
            elif verdict == "explicit" and "please fix" in text:
                name = "subagent" if self.single else "create_ticket"
                call_id = f"call_{trigger}"
                if self.single:
                    self.pending_subagents[call_id] = str(thread)
                calls.append(
                    ToolCall(
                        name,
                        {
                            "title": text[:60],
                            "scope": text,
                            "threads": [thread],
                            "device": "bench-device",
                            "mandate_from": trigger,
                        },
                        id=call_id,
                    )
                )
            elif verdict == "explicit":
                calls.append(ToolCall("reply", {"thread": thread, "text": "Noted."}))
            else:
                calls.append(ToolCall("ignore", {"trigger": trigger, "reason": "chatter"}))
        return ModelReply(tool_calls=calls) if calls else ModelReply(content="Nothing to do.")

    def work(self, request: ChatRequest) -> ModelReply:
        results = [m for m in request.messages if m.get("role") == "tool"]
        if not results:
            minutes = _duration(request.messages[1]["content"])
            seconds = minutes * 60 / self.scale
            return ModelReply(tool_calls=[ToolCall("shell", {"command": f"sleep {seconds:.3f}"})])
        last = request.messages[-1]
        if last.get("role") == "user" and '"type": "job_ended"' in str(last.get("content")):
            return ModelReply(
                tool_calls=[ToolCall("report", {"status": "ready", "summary": "fixed"})]
            )
        return ModelReply(content="Noted; the task is still running.")


@dataclasses.dataclass
class RunResult:
    design: str
    run: int
    completion_minutes: list[float]
    cancelled: int
    unfinished: int
    router_decisions: int
    router_prompt_tokens: int
    router_cached_tokens: int
    all_prompt_tokens: int
    wall_seconds: float

    def quantile(self, q: float) -> float:
        values = sorted(self.completion_minutes)
        if not values:
            return float("nan")
        return statistics.quantiles(values, n=100, method="inclusive")[int(q * 100) - 1]


async def _run(
    url: str, design: str, run: int, args: argparse.Namespace, llm: FakeOpenAIServer
) -> RunResult:
    scale = args.scale
    single = design == "single_session"
    # The replica's own polls and waits, scaled with everything else.
    worker_module.IDLE_POLL_SECONDS = 1.0 / scale
    worker_service.POLL_SECONDS = 1.0 / scale
    models = Models(scale, single)
    llm.respond_with(models)
    pool = await create_pool(asyncpg_dsn(url), size=12)
    queue = CommandQueue(pool)
    settings = Settings(
        openai_base_url=llm.url,
        openai_api_key=FAKE_API_KEY,
        workers=WorkerSettings(
            max_workers=args.max_workers,
            foreground_seconds=max(5.0 / scale, 0.05),
            lease_seconds=30,
            renew_seconds=5,
        ),
    )
    client = llm.async_openai_client(max_retries=0, timeout=600)
    intake = Intake(pool, pass_through=design == "two_tier")
    tmp = Path(tempfile.mkdtemp(prefix="bench-ablation-"))
    device = LocalDevice(pool, CommandDelivery(pool), tmp, name="bench-device", poll=0.01)
    await device.pair()
    await device.online()
    subagent = Subagent(pool, queue, client, settings, owner="bench") if single else None
    router = Router(pool, client, FAKE_MODEL, policy=intake.policy, subagent=subagent)
    workers = None
    if not single:
        workers = WorkerService(pool, queue, client, settings, owner="bench", dsn=asyncpg_dsn(url))
        await workers.start()
    messages = workload(args.seed + run)
    started = time.monotonic()
    requests: dict[int, str] = {}  # task -> request trigger id

    async def arrive() -> None:
        for index, message in enumerate(messages):
            delay = started + message.at * 60 / scale - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            actor = Actor(message.actor, message.actor, is_bot=message.actor == "ci-bot")
            done = await intake.ingest(
                IncomingTrigger(
                    source="github",
                    external_id=f"m{run}-{index}",
                    thread=ThreadRef(message.thread, title=message.thread),
                    actor=actor,
                    kind=message.kind,
                    text=message.text,
                )
            )
            if message.task is not None:
                requests[message.task] = done.trigger_id

    arriving = asyncio.create_task(arrive())
    deadline = started + (TASK_WINDOW_MINUTES + 60 + (300 if single else 0)) * 60 / scale
    try:
        while time.monotonic() < deadline:
            consumed = await router.turn()
            if arriving.done() and not consumed and await _all_done(pool, requests, TASKS):
                break
            if not consumed:
                await asyncio.sleep(0.01)
    finally:
        arriving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await arriving
        if workers is not None:
            await workers.stop(10)
        await device.offline()
    wall = time.monotonic() - started
    result = await _measure(pool, design, run, requests, scale, wall)
    await queue.close()
    await pool.close()
    return result


_DELIVERED = """
SELECT m.trigger_id, t.state, g.created_at AS asked,
       (SELECT min(d.created_at) FROM router_decisions d
        WHERE d.tool = 'reply' AND d.ok AND d.arguments->>'thread' = g.thread_id
          AND d.created_at >= r.created_at) AS told
FROM mandates m JOIN tickets t ON t.id = m.ticket_id JOIN triggers g ON g.id = m.trigger_id
LEFT JOIN LATERAL (SELECT created_at FROM reports WHERE ticket_id = t.id AND status = 'ready'
                   ORDER BY created_at DESC LIMIT 1) r ON true
WHERE m.trigger_id = ANY($1::text[])
"""


async def _all_done(pool: asyncpg.Pool, requests: dict[int, str], tasks: int) -> bool:
    if len(requests) < tasks:
        return False
    rows = await pool.fetch(_DELIVERED, list(requests.values()))
    if len(rows) < tasks:
        return False
    return all(row["told"] is not None or row["state"] == "stopped" for row in rows)


async def _measure(
    pool: asyncpg.Pool,
    design: str,
    run: int,
    requests: dict[int, str],
    scale: float,
    wall: float,
) -> RunResult:
    rows = await pool.fetch(_DELIVERED, list(requests.values()))
    completion = [
        (row["told"] - row["asked"]).total_seconds() * scale / 60
        for row in rows
        if row["told"] is not None and row["state"] != "stopped"
    ]
    cancelled = sum(1 for row in rows if row["state"] == "stopped")
    tokens = await pool.fetchrow(
        "SELECT coalesce(sum(c.prompt_tokens) FILTER (WHERE s.kind = 'router'), 0) AS router, "
        "coalesce(sum(c.cached_tokens) FILTER (WHERE s.kind = 'router'), 0) AS cached, "
        "coalesce(sum(c.prompt_tokens), 0) AS total "
        "FROM llm_calls c JOIN sessions s ON s.id = c.session_id"
    )
    assert tokens is not None
    return RunResult(
        design=design,
        run=run,
        completion_minutes=completion,
        cancelled=cancelled,
        unfinished=TASKS - len(completion) - cancelled,
        router_decisions=int(await pool.fetchval("SELECT count(*) FROM router_decisions")),
        router_prompt_tokens=int(tokens["router"]),
        router_cached_tokens=int(tokens["cached"]),
        all_prompt_tokens=int(tokens["total"]),
        wall_seconds=wall,
    )


def _mean(values: list[float]) -> float:
    return statistics.mean(values) if values else float("nan")


async def main(args: argparse.Namespace) -> None:
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    results: list[RunResult] = []
    with postgres_server(args.database_url) as server_url, FakeOpenAIServer() as llm:
        version = await postgres_version(server_url)
        for key, value in machine_summary(str(version)):
            print(f"- {key}: {value}")
        print(f"- scale 1/{args.scale:g}, {args.runs} run(s) per design, seed {args.seed}")
        for run in range(args.runs):
            for design in args.designs:
                url = await fresh_database(server_url, f"bench_ablation_{design}")
                from controlplane.db.urls import asyncpg_dsn
                from controlplane.ingest import admission
                from controlplane.versions import POLICY, save

                conn = await asyncpg.connect(asyncpg_dsn(url))
                try:
                    await save(
                        conn,
                        POLICY,
                        name=admission.POLICY_NAME,
                        body=Admission(default=SourceAdmission(users=list(PEOPLE))).model_dump(),
                        base_id=None,
                        author="bench",
                    )
                finally:
                    await conn.close()
                print(f"run {run + 1}: {design} …", flush=True)
                result = await _run(url, design, run, args, llm)
                results.append(result)
                print(
                    f"  p50 {result.quantile(0.5):.1f} min, p95 {result.quantile(0.95):.1f} min, "
                    f"{result.router_decisions} router decisions, "
                    f"{result.router_prompt_tokens:,} router prompt tokens "
                    f"({result.router_cached_tokens:,} cached), "
                    f"{result.cancelled} cancelled, {result.unfinished} unfinished, "
                    f"{result.wall_seconds:.0f} s",
                    flush=True,
                )
    rows = []
    by_design = {d: [r for r in results if r.design == d] for d in args.designs}
    for design, runs in by_design.items():
        p50 = _mean([r.quantile(0.5) for r in runs])
        p95 = _mean([r.quantile(0.95) for r in runs])
        rows.append(
            [
                design,
                len(runs),
                f"{p50:.1f}",
                f"{p95:.1f}",
                f"{p95 / p50:.2f}",
                f"{_mean([r.router_decisions for r in runs]):.0f}",
                f"{_mean([r.router_prompt_tokens for r in runs]):,.0f}",
                f"{_mean([r.router_cached_tokens for r in runs]):,.0f}",
                f"{_mean([r.all_prompt_tokens for r in runs]):,.0f}",
                sum(r.unfinished for r in runs),
            ]
        )
    print()
    print(
        markdown_table(
            [
                "design",
                "runs",
                "p50 (min)",
                "p95 (min)",
                "p95/p50",
                "router decisions",
                "router prompt tokens",
                "router cached tokens",
                "all prompt tokens",
                "unfinished tasks",
            ],
            rows,
        )
    )
    if "two_tier" in by_design and "no_pass_through" in by_design:
        on, off = by_design["two_tier"], by_design["no_pass_through"]
        tokens_on = _mean([r.router_prompt_tokens for r in on])
        tokens_off = _mean([r.router_prompt_tokens for r in off])
        decisions_on = _mean([r.router_decisions for r in on])
        decisions_off = _mean([r.router_decisions for r in off])
        cached_on = _mean([r.router_cached_tokens for r in on])
        cached_off = _mean([r.router_cached_tokens for r in off])
        print()
        print(
            f"pass-through saves {1 - tokens_on / tokens_off:.0%} of router prompt tokens; "
            f"without it, router decisions +{decisions_off / decisions_on - 1:.0%}, "
            f"cached tokens +{cached_off / cached_on - 1:.0%}"
        )
    if args.json:
        text = json.dumps([dataclasses.asdict(r) for r in results], indent=2, default=str)
        await asyncio.to_thread(Path(args.json).write_text, text)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.ablation", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--runs", type=int, default=5, help="runs per design")
    parser.add_argument(
        "--designs",
        type=lambda s: [d for d in s.split(",") if d],
        default=list(DESIGNS),
        help=f"comma-separated, from {', '.join(DESIGNS)}",
    )
    parser.add_argument("--scale", type=float, default=30.0, help="time compression factor")
    parser.add_argument("--max-workers", type=int, default=6, help="workers.max_workers")
    parser.add_argument("--seed", type=int, default=7, help="workload seed (run n uses seed+n)")
    parser.add_argument("--database-url", help="a Postgres server (default: embedded pgserver)")
    parser.add_argument("--json", help="write every run's numbers here")
    args = parser.parse_args(argv)
    unknown = [d for d in args.designs if d not in DESIGNS]
    if unknown:
        parser.error(f"unknown design(s): {', '.join(unknown)}")
    return args


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(parse_args(sys.argv[1:])))
