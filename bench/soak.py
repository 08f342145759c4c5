"""Soak: a real `superagent serve` under a steady workload, fault-free and then with faults.

Run by hand (never in CI)::

    python -m bench.soak [--minutes 30] [--model-faults 0.10] [--link-faults 0.05]
                         [--rate 6] [--devices 2] [--seed 1] [--json out.json]

Two runs of the same seeded workload, back to back (not interleaved), each against its own
real ``superagent serve`` process (``python -m controlplane.cli serve``) on a fresh,
migrated database of one embedded Postgres (``pgserver``): first **fault-free**, then
**faulty**. Everything else is the same in both runs, including the settings below.

What is real: the serve process (HTTP, gRPC gateway with TLS, router, workers, effects),
the ingest path (``controlplane.ingest.intake.Intake.ingest`` of web-chat messages from the
allowlisted user ``alice``, in this process, as the web chat does), ``--devices`` real
``endpointd`` daemons paired with pairing codes and ``endpointd pair`` (owned by
``web:alice``), and the shell commands they run. What is simulated: the models, by the
fake OpenAI server of the test suite (``tests/fakes/openai_server.py``), answering as a
competent model would:

* the router creates one ticket per request on a device (round robin by request number)
  with a work directory under the run's temporary directory, and replies on the request's
  thread for every report (``report.ready`` / ``report.question``); when every call of its
  last answer was refused (an injected garbled answer), it decides the batch again;
* the worker runs ``echo ok`` with the ``shell`` tool, then reports ``ready`` (two requests
  in three) or ``question`` (every third).

The workload: ``--rate`` requests per minute for ``--minutes`` (fractions allowed: 0.5 is a
smoke run), as a Poisson process from ``--seed`` (the same arrival times and texts in both
runs). After the last arrival the run drains, faults still on, until it has settled (no
trigger left undecided, no ticket open, running or waiting for a device) or
``--drain-seconds`` have passed; then it is measured from the database.

Faults (faulty run only):

* ``--model-faults P``: each model call (router and workers) is answered, with probability
  P, by a random fault of *every* kind in ``FAULTS`` (``inject_faults``, seeded), ``slow``
  included: it answers after 5 s, past the 2 s model timeout both runs use, so it is a
  timeout.
* ``--link-faults P``: each device dials the gateway through its own ``TcpProxy``; every
  ``--link-interval`` seconds (5) each device's link is cut (every connection reset) with
  probability P, so the daemon reconnects and catches up.

Settings of serve in both runs: ``SUPERAGENT_LLM__TIMEOUT_SECONDS=2`` (the fake answers in
milliseconds; this makes ``slow`` a timeout), everything else the product's defaults (model
tries 4 with 1 s doubling backoff, worker round retry 10 s doubling, leases 30 s).

Measured per run, and printed side by side with the faulty / fault-free ratio:

* requests ingested; decided (``routed_at`` set, not quarantined); quarantined
  (``undecidable_at`` set); still undecided; routed without a ticket (decided, but no
  mandate names the request: the router ended its turn without acting on it);
* time to decide a request, p50 and p95 (``triggers.created_at`` to ``routed_at``, both
  set by Postgres, decided requests only); the same for the workers' reports;
* tickets created; finished (``completed``, or ``waiting_human`` with a report); blocked
  (``hold = 'blocked'``); still open (anything else not final);
* replies sent or queued; reports no reply names; duplicate replies (the same text twice
  on one thread); threads with more than one reply (e.g. a "waiting for the device" notice);
* serve process exits (polled every second; a dead process is restarted and counted; the
  goal is 0) and ``/healthz`` misses (probed every second, 2 s timeout, while the process
  is alive);
* model calls and their outcomes (``llm_calls``), faults injected, link cuts, device
  connections through the proxies (pairing included; those beyond the fault-free run's are
  reconnects).

Also printed: the machine summary and the exact command. The serve and endpointd logs of
each run stay in a temporary directory whose path is printed when ``--keep`` is given.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import json
import os
import random
import re
import shlex
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from bench.simdevice import (
    fresh_database,
    machine_summary,
    markdown_table,
    postgres_server,
    postgres_version,
)
from controlplane.db.urls import asyncpg_dsn
from controlplane.domain import TicketState
from controlplane.gateway.tls import gateway_tls
from controlplane.ingest.admission import Actor, Admission, SourceAdmission
from controlplane.ingest.intake import IncomingTrigger, Intake, ThreadRef
from controlplane.settings import Settings
from tests.fakes.endpointd_process import Endpointd
from tests.fakes.openai_server import (
    FAKE_API_KEY,
    FAULTS,
    ChatRequest,
    FakeOpenAIServer,
    Reply,
    ToolCall,
)
from tests.fakes.tcp_proxy import TcpProxy
from tests.support.gateway_harness import pairing_code
from tests.support.helpers import free_port, save_policy
from tests.support.replica_process import ReplicaProcess

ALICE = Actor("alice", "alice", groups=("console",))
OWNER = "web:alice"
LIVE_STATES = (TicketState.OPEN, TicketState.RUNNING, TicketState.WAITING_DEVICE)
SERVE_ENV = {"SUPERAGENT_LLM__TIMEOUT_SECONDS": "2"}
_THREAD = re.compile(r"^thread (thr_\w+) ")
_EVENT = re.compile(r"^\s+\[(trg_\w+)\] \S+ (\S+) from .*?Z: (.*)$")
_REQUEST = re.compile(r"soak request (\d+)")


# -- the models ------------------------------------------------------------------------------


@dataclasses.dataclass
class Model:
    """Router and worker, as the fake OpenAI server's callback (runs in its thread)."""

    devices: list[str]
    workdir: str

    def __call__(self, request: ChatRequest) -> Reply:
        if "report" in request.tool_names():
            return self.work(request)
        return self.route(request)

    def route(self, request: ChatRequest) -> Reply:
        results = []
        for message in reversed(request.messages):
            if message.get("role") != "tool":
                break
            results.append(str(message.get("content") or ""))
        if results and not all('"error"' in result for result in results):
            return Reply(content="Done.")
        # Nothing yet, or only errors: a garbled answer of ours (an injected fault) was
        # refused, none of the intended calls ran, so decide the batch again.
        calls: list[ToolCall] = []
        thread = None
        for line in (request.last_user_message() or "").splitlines():
            if found := _THREAD.match(line):
                thread = found.group(1)
            elif event := _EVENT.match(line):
                trigger, kind, text = event.groups()
                if kind.startswith("report."):
                    reply = f"{trigger}: {kind}"
                    calls.append(ToolCall("reply", {"thread": thread, "text": reply}))
                elif number := _REQUEST.search(text):
                    n = int(number.group(1))
                    calls.append(
                        ToolCall(
                            "create_ticket",
                            {
                                "title": f"soak request {n}",
                                "scope": f"soak request {n}: run echo ok and report",
                                "threads": [thread] if thread else [],
                                "device": self.devices[n % len(self.devices)],
                                "mandate_from": trigger,
                                "workdir": self.workdir,
                            },
                        )
                    )
        return Reply(tool_calls=calls) if calls else Reply(content="Nothing to decide.")

    def work(self, request: ChatRequest) -> Reply:
        brief = next((m for m in request.messages if m.get("role") == "user"), {})
        number = _REQUEST.search(str(brief.get("content")))
        n = int(number.group(1)) if number else 0
        ran = False
        for message in request.messages:
            content = str(message.get("content") or "")
            if message.get("role") == "tool" and '"exit_code"' in content:
                ran = True
            if message.get("role") == "user" and '"job_ended"' in content:
                ran = True
        last = request.messages[-1]
        if not ran and last.get("role") == "tool" and '"note"' in str(last.get("content")):
            return Reply(content="Waiting for the command.")  # its end arrives as an event
        if not ran:
            return Reply(tool_calls=[ToolCall("shell", {"command": "echo ok"})])
        if n % 3 == 0:
            report = {
                "status": "question",
                "summary": "echo said ok",
                "question": "which branch next?",
            }
        else:
            report = {"status": "ready", "summary": "echo ok ran"}
        return Reply(tool_calls=[ToolCall("report", report)])


# -- one run ---------------------------------------------------------------------------------


@dataclasses.dataclass
class Monitor:
    exits: list[int | None] = dataclasses.field(default_factory=list)
    health_probes: int = 0
    health_misses: list[str] = dataclasses.field(default_factory=list)
    link_cuts: int = 0


def schedule(minutes: float, rate: float, seed: int) -> list[float]:
    """Arrival times (seconds from the start) of a Poisson process of ``rate`` per minute."""
    rng = random.Random(seed)
    times, t = [], 0.0
    while rate > 0:
        t += rng.expovariate(rate / 60.0)
        if t >= minutes * 60.0:
            break
        times.append(t)
    return times


async def _watch(replica: ReplicaProcess, monitor: Monitor, stop: asyncio.Event) -> None:
    """Every second: is serve alive (restart it if not), does /healthz answer."""
    async with httpx.AsyncClient(timeout=2.0) as client:
        while not stop.is_set():
            if not replica.alive():
                code = replica.process.returncode if replica.process is not None else None
                monitor.exits.append(code)
                print(f"  serve exited (code {code}); restarting", flush=True)
                replica.start()
            else:
                monitor.health_probes += 1
                try:
                    answer = await client.get(f"{replica.url}/healthz")
                    if answer.status_code != 200:
                        monitor.health_misses.append(str(answer.status_code))
                except httpx.HTTPError as exc:
                    if replica.alive():
                        monitor.health_misses.append(type(exc).__name__)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)


async def _cut_links(
    proxies: list[TcpProxy],
    probability: float,
    interval: float,
    seed: int,
    monitor: Monitor,
    stop: asyncio.Event,
) -> None:
    rng = random.Random(seed)
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
        if stop.is_set():
            return
        for proxy in proxies:
            if rng.random() < probability:
                proxy.drop_all()
                monitor.link_cuts += 1


async def _connected(pool: asyncpg.Pool, names: list[str]) -> bool:
    count = await pool.fetchval(
        "SELECT count(*) FROM devices WHERE name = ANY($1::text[]) AND revoked_at IS NULL "
        "AND connected_replica IS NOT NULL",
        names,
    )
    return bool(count == len(names))


async def _eventually(check: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.25)
    raise RuntimeError(f"timed out waiting: {what}")


async def _settled(pool: asyncpg.Pool) -> bool:
    undecided = await pool.fetchval(
        "SELECT count(*) FROM triggers WHERE routed_at IS NULL AND undecidable_at IS NULL"
    )
    live = await pool.fetchval(
        "SELECT count(*) FROM tickets WHERE state = ANY($1::text[])", list(LIVE_STATES)
    )
    return bool(undecided == 0 and live == 0)


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


async def _measure(pool: asyncpg.Pool) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for source, name in (("web", "requests"), ("agent", "reports")):
        rows = await pool.fetch(
            "SELECT extract(epoch FROM routed_at - created_at)::float8 AS seconds, "
            "routed_at IS NOT NULL AND undecidable_at IS NULL AS decided, "
            "undecidable_at IS NOT NULL AS quarantined, "
            "EXISTS (SELECT 1 FROM mandates m WHERE m.trigger_id = g.id) AS ticketed "
            "FROM triggers g WHERE source = $1",
            source,
        )
        seconds = [r["seconds"] for r in rows if r["decided"]]
        result[name] = {
            "ingested": len(rows),
            "decided": sum(1 for r in rows if r["decided"]),
            "quarantined": sum(1 for r in rows if r["quarantined"]),
            "undecided": sum(1 for r in rows if not r["decided"] and not r["quarantined"]),
            "decided_without_ticket": sum(1 for r in rows if r["decided"] and not r["ticketed"]),
            "decide_p50_s": _quantile(seconds, 0.50),
            "decide_p95_s": _quantile(seconds, 0.95),
            "decide_max_s": max(seconds) if seconds else None,
        }
    tickets = await pool.fetch(
        "SELECT t.id, t.state, t.hold, EXISTS (SELECT 1 FROM reports r WHERE r.ticket_id = t.id) "
        "AS reported FROM tickets t"
    )
    finished = [
        t
        for t in tickets
        if t["state"] == "completed" or (t["state"] == "waiting_human" and t["reported"])
    ]
    result["tickets"] = {
        "created": len(tickets),
        "finished": len(finished),
        "blocked": sum(1 for t in tickets if t["hold"] == "blocked"),
        "open": sum(1 for t in tickets if t["state"] in LIVE_STATES),
        "states": _counts(t["state"] for t in tickets),
        "holds": _counts(t["hold"] for t in tickets),
    }
    said = await pool.fetch(
        "SELECT thread_id, text FROM sent_messages UNION ALL "
        "SELECT payload->>'thread_id', payload->>'text' FROM effects WHERE kind = 'reply'"
    )
    texts = [(r["thread_id"], r["text"]) for r in said]
    result["replies"] = len(texts)
    reports = await pool.fetch("SELECT id FROM triggers WHERE source = 'agent'")
    told = {text.split(":", 1)[0] for _, text in texts if text}
    result["reports_without_reply"] = sum(1 for r in reports if r["id"] not in told)
    per_thread = collections.Counter(thread for thread, _ in texts)
    result["threads_with_several_replies"] = sum(1 for n in per_thread.values() if n > 1)
    result["reply_texts"] = sorted(f"{thread}: {text}" for thread, text in texts)
    result["duplicate_replies"] = len(texts) - len(set(texts))
    requests_per_ticket = await pool.fetch(
        "SELECT trigger_id, count(DISTINCT ticket_id) AS n FROM mandates GROUP BY trigger_id "
        "HAVING count(DISTINCT ticket_id) > 1"
    )
    result["requests_with_several_tickets"] = len(requests_per_ticket)
    outcomes = await pool.fetch("SELECT outcome, count(*) AS n FROM llm_calls GROUP BY outcome")
    result["llm_calls"] = {r["outcome"]: r["n"] for r in outcomes}
    jobs = await pool.fetch("SELECT c.exit_code FROM jobs j JOIN commands c ON c.id = j.command_id")
    result["commands"] = len(jobs)
    result["commands_ok"] = sum(1 for j in jobs if j["exit_code"] == 0)
    return result


def _counts(items: Iterable[object]) -> dict[str, int]:
    return dict(sorted(collections.Counter(str(item) for item in items).items()))


async def run_once(
    args: argparse.Namespace, server_url: str, label: str, faulty: bool, root: Path
) -> dict[str, Any]:
    print(f"\n## run: {label}", flush=True)
    run_dir = root / label
    run_dir.mkdir()
    work = run_dir / "work"
    work.mkdir()
    url = await fresh_database(server_url, f"soak_{label}")
    await save_policy(url, Admission(default=SourceAdmission(users=[ALICE.id])))
    names = [f"soak-{i}" for i in range(args.devices)]
    llm = FakeOpenAIServer()
    llm.start()
    llm.respond_with(Model(names, str(work)))
    if faulty and args.model_faults > 0:
        llm.inject_faults(args.model_faults, seed=args.seed, kinds=list(FAULTS))
    state = run_dir / "state"
    http_port, grpc_port = free_port(), free_port()
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "SUPERAGENT_STATE_DIR": str(state),
        "SUPERAGENT_HTTP__PORT": str(http_port),
        "SUPERAGENT_GRPC__PORT": str(grpc_port),
        "OPENAI_BASE_URL": llm.url,
        "OPENAI_API_KEY": FAKE_API_KEY,
        **SERVE_ENV,
    }
    env.pop("SUPERAGENT_ADMIN_TOKEN", None)
    tls = gateway_tls(Settings(state_dir=state))
    assert tls is not None
    replica = ReplicaProcess(env, run_dir / "serve.log", http_port)
    pool = await asyncpg.create_pool(asyncpg_dsn(url), min_size=1, max_size=4)
    assert pool is not None
    proxies: list[TcpProxy] = []
    daemons: list[Endpointd] = []
    monitor = Monitor()
    stop = asyncio.Event()
    background: list[asyncio.Task[None]] = []
    try:
        replica.start()
        await _eventually(replica.up, 60, f"serve up (log {replica.log})")
        for name in names:
            proxy = await TcpProxy("127.0.0.1", grpc_port).start()
            proxies.append(proxy)
            daemon = Endpointd(run_dir, name=name)
            daemons.append(daemon)
            code = await pairing_code(pool, name, owner=OWNER)
            paired = await asyncio.to_thread(
                daemon.pair,
                f"https://127.0.0.1:{proxy.port}",
                code,
                "--fingerprint",
                tls.fingerprint,
            )
            if paired.returncode != 0:
                raise RuntimeError(f"pairing {name} failed: {paired.stdout}{paired.stderr}")
            daemon.start()
        await _eventually(lambda: _connected(pool, names), 60, "devices connected")
        print(f"  serve up, {len(names)} devices connected", flush=True)
        background.append(asyncio.create_task(_watch(replica, monitor, stop)))
        if faulty and args.link_faults > 0:
            background.append(
                asyncio.create_task(
                    _cut_links(
                        proxies, args.link_faults, args.link_interval, args.seed, monitor, stop
                    )
                )
            )
        intake = Intake(pool)
        arrivals = schedule(args.minutes, args.rate, args.seed)
        started = time.monotonic()
        for n, at in enumerate(arrivals, start=1):
            await asyncio.sleep(max(0.0, started + at - time.monotonic()))
            await intake.ingest(
                IncomingTrigger(
                    source="web",
                    external_id=f"soak-{args.seed}-{n}",
                    thread=ThreadRef(f"soak-thread-{args.seed}-{n}"),
                    actor=ALICE,
                    kind="message",
                    text=f"@superagent soak request {n}: please run echo ok",
                    direct=True,
                )
            )
        await asyncio.sleep(max(0.0, started + args.minutes * 60 - time.monotonic()))
        load_seconds = time.monotonic() - started
        print(f"  {len(arrivals)} requests in {load_seconds:.0f} s; draining", flush=True)
        drain_started = time.monotonic()
        settled = False
        while time.monotonic() - drain_started < args.drain_seconds:
            if await _settled(pool):
                settled = True
                break
            await asyncio.sleep(1.0)
        drained = time.monotonic() - drain_started
        stop.set()
        for task in background:
            await task
        result = await _measure(pool)
    finally:
        stop.set()
        for task in background:
            if not task.done():
                task.cancel()
        for daemon in daemons:
            await asyncio.to_thread(daemon.cleanup)
        for proxy in proxies:
            await proxy.stop()
        await pool.close()
        await asyncio.to_thread(replica.stop)
        llm.stop()
    result |= {
        "label": label,
        "arrivals": len(arrivals),
        "load_seconds": load_seconds,
        "drain_seconds": drained,
        "settled": settled,
        "serve_exits": len(monitor.exits),
        "serve_exit_codes": monitor.exits,
        "healthz_probes": monitor.health_probes,
        "healthz_misses": len(monitor.health_misses),
        "healthz_miss_kinds": _counts(monitor.health_misses),
        "link_cuts": monitor.link_cuts,
        "device_connections": sum(p.connections for p in proxies),
        "faults_injected": len(llm.faults_injected),
        "fault_kinds": _counts(llm.faults_injected),
        "model_requests": len(llm.chat_requests),
        "serve_log_errors": _log_errors(replica.log),
    }
    print(f"  {'settled' if settled else 'NOT settled'} after {drained:.0f} s of drain", flush=True)
    return result


def _log_errors(log: Path) -> int:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return 0
    return sum(1 for line in text.splitlines() if "Traceback" in line)


# -- the report ------------------------------------------------------------------------------


def _fmt(value: object) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def _ratio(faulty: object, clean: object) -> str:
    if not isinstance(faulty, int | float) or not isinstance(clean, int | float):
        return "–"
    if clean == 0:
        return "–" if faulty == 0 else "∞"
    return f"{faulty / clean:.2f}×"


def table(clean: dict[str, Any], faulty: dict[str, Any]) -> str:
    def row(name: str, get: Any) -> list[str]:
        a, b = get(clean), get(faulty)
        return [name, _fmt(a), _fmt(b), _ratio(b, a)]

    rows = [
        row("requests ingested", lambda r: r["requests"]["ingested"]),
        row("requests decided", lambda r: r["requests"]["decided"]),
        row("requests quarantined", lambda r: r["requests"]["quarantined"]),
        row("requests still undecided", lambda r: r["requests"]["undecided"]),
        row("requests routed without a ticket", lambda r: r["requests"]["decided_without_ticket"]),
        row("decide p50 (s)", lambda r: r["requests"]["decide_p50_s"]),
        row("decide p95 (s)", lambda r: r["requests"]["decide_p95_s"]),
        row("decide max (s)", lambda r: r["requests"]["decide_max_s"]),
        row("tickets created", lambda r: r["tickets"]["created"]),
        row("tickets finished", lambda r: r["tickets"]["finished"]),
        row("tickets blocked", lambda r: r["tickets"]["blocked"]),
        row("tickets still open", lambda r: r["tickets"]["open"]),
        row("requests with >1 ticket", lambda r: r["requests_with_several_tickets"]),
        row("reports decided", lambda r: r["reports"]["decided"]),
        row("reports quarantined", lambda r: r["reports"]["quarantined"]),
        row("report decide p50 (s)", lambda r: r["reports"]["decide_p50_s"]),
        row("report decide p95 (s)", lambda r: r["reports"]["decide_p95_s"]),
        row("replies sent or queued", lambda r: r["replies"]),
        row("reports not replied to", lambda r: r["reports_without_reply"]),
        row("duplicate replies", lambda r: r["duplicate_replies"]),
        row("threads with >1 reply", lambda r: r["threads_with_several_replies"]),
        row("commands run (exit 0)", lambda r: r["commands_ok"]),
        row("serve exits (goal 0)", lambda r: r["serve_exits"]),
        row("/healthz misses", lambda r: r["healthz_misses"]),
        row("/healthz probes", lambda r: r["healthz_probes"]),
        row("model calls", lambda r: r["model_requests"]),
        row("model faults injected", lambda r: r["faults_injected"]),
        row("link cuts", lambda r: r["link_cuts"]),
        row("device connections", lambda r: r["device_connections"]),
        row("tracebacks in serve log", lambda r: r["serve_log_errors"]),
        row("drain (s)", lambda r: r["drain_seconds"]),
        row("settled", lambda r: "yes" if r["settled"] else "no"),
    ]
    return markdown_table(["", "fault-free", "faulty", "faulty / fault-free"], rows)


async def main(args: argparse.Namespace) -> None:
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    command = "python -m bench.soak " + shlex.join(sys.argv[1:])
    root = Path(tempfile.mkdtemp(prefix="bench-soak-"))
    try:
        with postgres_server(args.database_url) as server:
            version = await postgres_version(server)
            print("# Soak: fault-free vs faulty\n")
            print(markdown_table(["", ""], machine_summary(version)))
            print(f"\ncommand: `{command}`")
            print(
                f"workload: {args.rate}/min for {args.minutes} min, seed {args.seed}, "
                f"{args.devices} devices; faulty run: model faults {args.model_faults} "
                f"(all of FAULTS, slow included), link faults {args.link_faults} per device "
                f"every {args.link_interval} s; serve env {SERVE_ENV}",
                flush=True,
            )
            clean = await run_once(args, server, "fault_free", False, root)
            faulty = await run_once(args, server, "faulty", True, root)
        print()
        print(table(clean, faulty))
        print()
        for result in (clean, faulty):
            print(
                f"{result['label']}: ticket states {result['tickets']['states']}, holds "
                f"{result['tickets']['holds']}; "
                f"model outcomes {result['llm_calls']}; faults {result['fault_kinds']}; "
                f"healthz misses {result['healthz_miss_kinds']}; serve exit codes "
                f"{result['serve_exit_codes']}"
            )
        if args.json:
            text = json.dumps({"command": command, "runs": [clean, faulty]}, indent=2, default=str)
            await asyncio.to_thread(Path(args.json).write_text, text)
    finally:
        if args.keep:
            print(f"\nlogs kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--minutes", type=float, default=30.0, help="load per run (fractions ok)")
    parser.add_argument("--model-faults", type=float, default=0.10, help="share of model calls")
    parser.add_argument("--link-faults", type=float, default=0.05, help="cut probability")
    parser.add_argument("--link-interval", type=float, default=5.0, help="seconds between cuts")
    parser.add_argument("--rate", type=float, default=6.0, help="requests per minute")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--drain-seconds", type=float, default=120.0, help="longest drain")
    parser.add_argument("--database-url", help="a server where soak_* databases may be dropped")
    parser.add_argument("--json", help="also write the raw results here")
    parser.add_argument("--keep", action="store_true", help="keep the logs' directory")
    args = parser.parse_args(argv)
    if args.devices < 1:
        parser.error("--devices must be at least 1")
    return args


if __name__ == "__main__":
    asyncio.run(main(parse_args(sys.argv[1:])))
