"""Outbox benchmark: our effect runner against pgqueuer and procrastinate, on one Postgres.

Run by hand (never in CI)::

    python -m bench.outbox [--jobs N] [--runners 1,4,16] [--latency-samples N]
                           [--database-url URL] [--mixed-runners R] [--repeat K] ...

Every system runs the same no-op job. Measurements:

* **Throughput** ("drain") with R runners: N jobs are inserted first (batches of 500 per
  statement/transaction, untimed but reported), the tables vacuumed, then R independent
  runners start, each with its own connections. The clock runs from the first handler start
  until the queue table is empty: every job was claimed, executed and completed (deleted).
  Jobs/s = N / that time.
* **Insert while running** ("mixed", ``--mixed-runners R``, default 4): R runners start idle,
  then the same N jobs are inserted in the same batches while they work; the clock runs from
  the first insert until the queue table is empty, so insert cost counts too.
* **Latency** on an idle system with one runner: one job at a time is inserted, and the time
  from just before the insert is sent until its handler starts is recorded (the insert's
  own round trip is included, so the figure is an upper bound). The next job is inserted
  only after the previous one started, after a randomised 20–30 ms pause; 10 warm-up jobs
  are discarded. The samples are taken in rounds (``--latency-rounds``, default 4), the
  systems taking turns, so a noisy moment on a shared machine hits all of them.

Every measurement runs in a fresh Python process (``multiprocessing`` spawn) holding the
runners *and* the producer on one asyncio loop, so no system inherits another's leftovers
(pools, background tasks, garbage); the parent only orchestrates. By default one
throwaway Postgres (the ``pgserver`` wheel's, as the test suite's) is started in a temporary
directory; each system gets its own database on it (``bench_ours``, ``bench_pgqueuer``,
``bench_procrastinate``, dropped and recreated at start). Before each measurement the
system's tables are truncated. Throughput runs are interleaved (for each runner count, each
system in turn), so drift on a noisy machine hits all systems alike.

What one runner is, per system (``--concurrency C``, ``--batch B``, both 32 by default):

* ours: one ``EffectRunner`` (its own asyncpg pool of up to 4 plus one LISTEN connection),
  ``EffectsSettings(concurrency=C, batch_size=B)``.
* pgqueuer: one ``QueueManager`` over ``AsyncpgDriver`` on its own asyncpg connection
  (pgqueuer's standard set-up), ``run(batch_size=B)`` without ``max_concurrent_tasks``
  (its default; a cap must be at least 2·B, so capping at C would force B ≤ C/2 and halve
  its throughput; ``--pgqueuer-cap`` measures that variant).
* procrastinate: one ``App`` with its own ``PsycopgConnector`` pool (up to 5, one of them
  LISTENing) running ``run_worker_async(concurrency=C, delete_jobs="successful")``; it
  fetches one job per round trip by design.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import dataclasses
import datetime
import importlib
import importlib.metadata
import itertools
import json
import logging
import multiprocessing
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import asyncpg
from pgserver.postgres_server import get_server

from controlplane.db import migrate
from controlplane.db.urls import asyncpg_dsn
from controlplane.effects import ClaimedEffect, Handlers, enqueue
from controlplane.effects.outbox import enqueue_many
from controlplane.effects.runner import EffectRunner
from controlplane.settings import EffectsSettings
from tests.support.database import with_database

SYSTEMS = ("ours", "pgqueuer", "procrastinate")
NOOP = "noop"
INSERT_CHUNK = 500  # jobs per insert transaction / batch call, for every system
MIXED_IDLE_SECONDS = 3.0  # runners idle this long before the insert-while-running burst


# -- what a handler reports ----------------------------------------------------------------


class Probe:
    """Counts handler starts and remembers when they happened (``time.perf_counter``)."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.count = 0
        self.first: float | None = None
        self.all_started = asyncio.Event()
        self._next: asyncio.Future[float] | None = None

    def started(self) -> None:
        now = time.perf_counter()
        self.count += 1
        if self.first is None:
            self.first = now
        if self._next is not None and not self._next.done():
            self._next.set_result(now)
        if self.count >= self.target:
            self.all_started.set()

    def expect_one(self) -> asyncio.Future[float]:
        self._next = asyncio.get_running_loop().create_future()
        return self._next


# -- the three systems ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Options:
    concurrency: int  # jobs one runner executes at once (ours, procrastinate)
    batch: int  # jobs claimed per round trip (ours, pgqueuer; procrastinate fetches one)
    pgqueuer_cap: bool = False  # also cap pgqueuer's in-flight jobs (max_concurrent_tasks)
    ours_single_insert: bool = False  # batched inserts with enqueue() per row, not enqueue_many
    ours_default_planner: bool = False  # runner pools without the runner's planner settings


class System(ABC):
    """One queue implementation: its schema, a batched insert, a single insert, runners."""

    name: str
    queue_table: str  # empty when every job is executed and completed
    tables: tuple[str, ...]  # truncated before, vacuumed after the pre-insert

    def __init__(self, url: str, options: Options) -> None:
        self.url = url
        self.dsn = asyncpg_dsn(url)
        self.options = options

    @abstractmethod
    async def install(self) -> None: ...

    @abstractmethod
    async def insert(self, count: int) -> None:
        """Insert ``count`` no-op jobs in batches of ``INSERT_CHUNK``."""

    @abstractmethod
    async def open_producer(self) -> None: ...

    @abstractmethod
    async def insert_one(self, index: int) -> None:
        """Insert (and commit) one no-op job."""

    @abstractmethod
    async def close_producer(self) -> None: ...

    @abstractmethod
    async def start_runners(self, count: int, probe: Probe) -> None: ...

    @abstractmethod
    async def stop_runners(self) -> None: ...

    async def reset(self) -> None:
        conn = await asyncpg.connect(self.dsn)
        try:
            await conn.execute(f"TRUNCATE {', '.join(self.tables)} CASCADE")
        finally:
            await conn.close()

    async def vacuum(self) -> None:
        conn = await asyncpg.connect(self.dsn)
        try:
            await conn.execute(f"VACUUM ANALYZE {', '.join(self.tables)}")
        finally:
            await conn.close()


class Ours(System):
    name = "ours"
    queue_table = "effects"
    tables = ("effects",)

    def __init__(self, url: str, options: Options) -> None:
        super().__init__(url, options)
        self._runners: list[EffectRunner] = []
        self._pools: list[asyncpg.Pool] = []
        self._producer: asyncpg.Connection | None = None

    async def install(self) -> None:
        await migrate.upgrade(self.url)

    async def insert(self, count: int) -> None:
        conn = await asyncpg.connect(self.dsn)
        try:
            for start in range(0, count, INSERT_CHUNK):
                stop = min(count, start + INSERT_CHUNK)
                if self.options.ours_single_insert:
                    async with conn.transaction():
                        for i in range(start, stop):
                            await enqueue(conn, NOOP, f"job-{i}", {})
                else:
                    await enqueue_many(conn, [(NOOP, f"job-{i}", {}) for i in range(start, stop)])
        finally:
            await conn.close()

    async def open_producer(self) -> None:
        self._producer = await asyncpg.connect(self.dsn)

    async def insert_one(self, index: int) -> None:
        assert self._producer is not None
        await enqueue(self._producer, NOOP, f"one-{index}", {})

    async def close_producer(self) -> None:
        if self._producer is not None:
            await self._producer.close()
            self._producer = None

    async def start_runners(self, count: int, probe: Probe) -> None:
        async def noop(effect: ClaimedEffect) -> None:
            probe.started()

        handlers = Handlers()
        handlers.register(NOOP, noop)
        settings = EffectsSettings(
            concurrency=self.options.concurrency, batch_size=self.options.batch
        )
        for i in range(count):
            pool = await self._default_planner_pool() if self.options.ours_default_planner else None
            if pool is not None:
                self._pools.append(pool)
            self._runners.append(
                EffectRunner(self.dsn, handlers, settings, pool=pool, owner=f"bench-{i}")
            )
        for runner in self._runners:
            await runner.start()

    async def _default_planner_pool(self) -> asyncpg.Pool:
        """The runner's pool as it was before its planner settings (for before/after)."""

        async def init(conn: asyncpg.Connection) -> None:
            await conn.set_type_codec(
                "jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog"
            )

        pool = await asyncpg.create_pool(
            self.dsn,
            min_size=1,
            max_size=4,
            init=init,
            server_settings={"idle_in_transaction_session_timeout": "60000"},
        )
        assert pool is not None
        return pool

    async def stop_runners(self) -> None:
        await asyncio.gather(*(runner.stop(10) for runner in self._runners))
        self._runners = []
        pools, self._pools = self._pools, []
        for pool in pools:
            await pool.close()


class PgQueuer(System):
    name = "pgqueuer"
    queue_table = "pgqueuer"
    tables = ("pgqueuer", "pgqueuer_log", "pgqueuer_statistics")

    def __init__(self, url: str, options: Options) -> None:
        super().__init__(url, options)
        self._managers: list[Any] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._runner_connections: list[asyncpg.Connection] = []
        self._producer: asyncpg.Connection | None = None

    @staticmethod
    def _queries(conn: asyncpg.Connection) -> Any:
        from pgqueuer.db import AsyncpgDriver
        from pgqueuer.queries import Queries

        return Queries(AsyncpgDriver(conn))

    async def install(self) -> None:
        conn = await asyncpg.connect(self.dsn)
        try:
            await self._queries(conn).install()
        finally:
            await conn.close()

    async def insert(self, count: int) -> None:
        conn = await asyncpg.connect(self.dsn)
        try:
            queries = self._queries(conn)
            for start in range(0, count, INSERT_CHUNK):
                size = min(count, start + INSERT_CHUNK) - start
                await queries.enqueue([NOOP] * size, [None] * size, [0] * size)
        finally:
            await conn.close()

    async def open_producer(self) -> None:
        self._producer = await asyncpg.connect(self.dsn)

    async def insert_one(self, index: int) -> None:
        assert self._producer is not None
        await self._queries(self._producer).enqueue(NOOP, None)

    async def close_producer(self) -> None:
        if self._producer is not None:
            await self._producer.close()
            self._producer = None

    async def start_runners(self, count: int, probe: Probe) -> None:
        from pgqueuer.qm import QueueManager

        batch = self.options.batch
        # Uncapped is pgqueuer's default. A cap must be at least twice the batch size.
        cap = max(self.options.concurrency, 2 * batch) if self.options.pgqueuer_cap else None
        for _ in range(count):
            conn = await asyncpg.connect(self.dsn)
            self._runner_connections.append(conn)
            manager = QueueManager(self._queries(conn))

            async def noop(job: Any) -> None:
                probe.started()

            manager.entrypoint(NOOP)(noop)
            self._managers.append(manager)
            self._tasks.append(
                asyncio.create_task(manager.run(batch_size=batch, max_concurrent_tasks=cap))
            )

    async def stop_runners(self) -> None:
        for manager in self._managers:
            manager.shutdown.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        connections, self._runner_connections = self._runner_connections, []
        for conn in connections:
            await conn.close()
        self._managers, self._tasks = [], []


class Procrastinate(System):
    name = "procrastinate"
    queue_table = "procrastinate_jobs"
    tables = ("procrastinate_jobs",)
    pool_size = 5  # like ours: 4 for queries plus the LISTEN connection

    def __init__(self, url: str, options: Options) -> None:
        super().__init__(url, options)
        self._apps: list[Any] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._producer: Any = None

    def _app(self, probe: Probe | None, pool_size: int) -> Any:
        from procrastinate import App, PsycopgConnector

        app = App(connector=PsycopgConnector(conninfo=self.dsn, min_size=1, max_size=pool_size))

        async def noop() -> None:
            if probe is not None:
                probe.started()

        app.task(name=NOOP)(noop)
        return app

    async def install(self) -> None:
        app = self._app(None, 1)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    async def insert(self, count: int) -> None:
        app = self._app(None, 1)
        async with app.open_async():
            task = app.tasks[NOOP]
            for start in range(0, count, INSERT_CHUNK):
                size = min(count, start + INSERT_CHUNK) - start
                await task.batch_defer_async(*({} for _ in range(size)))

    async def open_producer(self) -> None:
        self._producer = self._app(None, 1)
        await self._producer.open_async()

    async def insert_one(self, index: int) -> None:
        await self._producer.tasks[NOOP].defer_async()

    async def close_producer(self) -> None:
        if self._producer is not None:
            await self._producer.close_async()
            self._producer = None

    async def start_runners(self, count: int, probe: Probe) -> None:
        for i in range(count):
            app = self._app(probe, self.pool_size)
            await app.open_async()
            self._apps.append(app)
            self._tasks.append(
                asyncio.create_task(
                    app.run_worker_async(
                        name=f"bench-{i}",
                        concurrency=self.options.concurrency,
                        delete_jobs="successful",
                        listen_notify=True,
                        install_signal_handlers=False,
                    )
                )
            )

    async def stop_runners(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for app in self._apps:
            await app.close_async()
        self._apps, self._tasks = [], []


SYSTEM_TYPES: dict[str, type[System]] = {
    "ours": Ours,
    "pgqueuer": PgQueuer,
    "procrastinate": Procrastinate,
}


# -- measurements (each in a fresh process) ------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Job:
    """One measurement, sent to a child process."""

    mode: str  # "install", "throughput", "mixed" or "latency"
    system: str
    url: str
    options: Options
    runners: int = 1
    jobs: int = 0
    samples: int = 0


@dataclasses.dataclass(frozen=True)
class Throughput:
    mode: str  # "drain": pre-inserted backlog; "mixed": inserted while the runners run
    system: str
    runners: int
    jobs: int
    executed: int
    insert_seconds: float
    # drain: first handler start -> queue table empty; mixed: first insert -> empty
    drain_seconds: float
    wall_seconds: float  # runners started (drain) / first insert (mixed) -> table empty

    @property
    def jobs_per_second(self) -> float:
        return self.jobs / self.drain_seconds if self.drain_seconds > 0 else 0.0


@dataclasses.dataclass(frozen=True)
class Latency:
    system: str
    samples: int
    p50_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float
    raw_ms: tuple[float, ...] = ()  # in sample order, for --json


async def _remaining(conn: asyncpg.Connection, table: str) -> int:
    value = await conn.fetchval(f"SELECT count(*) FROM {table}")
    assert isinstance(value, int)
    return value


async def _wait_until_done(
    system: System, probe: Probe, watcher: asyncpg.Connection, since: float, timeout: float
) -> float:
    """Wait until every job started and the queue table is empty; return that moment."""
    await asyncio.wait_for(probe.all_started.wait(), timeout)
    while await _remaining(watcher, system.queue_table):
        await asyncio.sleep(0.002)
        if time.perf_counter() - since > timeout:
            raise TimeoutError(f"{system.name}: jobs left in {system.queue_table}")
    return time.perf_counter()


async def measure_throughput(system: System, runners: int, jobs: int) -> Throughput:
    """Pre-insert ``jobs``, then time R runners draining them (claim, execute, complete)."""
    await system.reset()
    began = time.perf_counter()
    await system.insert(jobs)
    insert_seconds = time.perf_counter() - began
    await system.vacuum()
    probe = Probe(jobs)
    watcher = await asyncpg.connect(system.dsn)
    timeout = max(120.0, jobs / 50)
    try:
        wall_start = time.perf_counter()
        await system.start_runners(runners, probe)
        try:
            end = await _wait_until_done(system, probe, watcher, wall_start, timeout)
        finally:
            await system.stop_runners()
    finally:
        await watcher.close()
    assert probe.first is not None
    return Throughput(
        mode="drain",
        system=system.name,
        runners=runners,
        jobs=jobs,
        executed=probe.count,
        insert_seconds=insert_seconds,
        drain_seconds=end - probe.first,
        wall_seconds=end - wall_start,
    )


async def measure_mixed(system: System, runners: int, jobs: int) -> Throughput:
    """Start R runners, let them idle, then insert ``jobs`` (same batches) while they work."""
    await system.reset()
    await system.vacuum()
    probe = Probe(jobs)
    watcher = await asyncpg.connect(system.dsn)
    timeout = max(120.0, jobs / 50)
    try:
        await system.start_runners(runners, probe)
        try:
            # Runners mostly poll an empty table; a burst then meets whatever that left
            # behind (pooled connections, prepared statements, plans for an empty table).
            await asyncio.sleep(MIXED_IDLE_SECONDS)
            began = time.perf_counter()
            await system.insert(jobs)
            insert_seconds = time.perf_counter() - began
            end = await _wait_until_done(system, probe, watcher, began, timeout)
        finally:
            await system.stop_runners()
    finally:
        await watcher.close()
    return Throughput(
        mode="mixed",
        system=system.name,
        runners=runners,
        jobs=jobs,
        executed=probe.count,
        insert_seconds=insert_seconds,
        drain_seconds=end - began,
        wall_seconds=end - began,
    )


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, ``q`` in [0, 100]."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


async def measure_latency(system: System, samples: int, warmup: int = 10) -> Latency:
    await system.reset()
    probe = Probe(sys.maxsize)
    await system.open_producer()
    try:
        await system.start_runners(1, probe)
        try:
            await asyncio.sleep(0.5)  # let the runner connect and reach its idle wait
            seen: list[float] = []
            for i in range(warmup + samples):
                await asyncio.sleep(0.02 + random.random() * 0.01)
                started = probe.expect_one()
                sent = time.perf_counter()
                await system.insert_one(i)
                start = await asyncio.wait_for(started, 30)
                if i >= warmup:
                    seen.append(start - sent)
        finally:
            await system.stop_runners()
    finally:
        await system.close_producer()
    return summarize(system.name, [s * 1000 for s in seen])


def summarize(system: str, ms: Sequence[float]) -> Latency:
    return Latency(
        system=system,
        samples=len(ms),
        p50_ms=percentile(ms, 50),
        p99_ms=percentile(ms, 99),
        mean_ms=statistics.fmean(ms),
        max_ms=max(ms),
        raw_ms=tuple(ms),
    )


async def _run_job(job: Job) -> Throughput | Latency | None:
    system = SYSTEM_TYPES[job.system](job.url, job.options)
    if job.mode == "throughput":
        return await measure_throughput(system, job.runners, job.jobs)
    if job.mode == "mixed":
        return await measure_mixed(system, job.runners, job.jobs)
    if job.mode == "latency":
        return await measure_latency(system, job.samples)
    if job.mode == "install":
        await system.install()
        return None
    raise ValueError(f"unknown mode {job.mode!r}")


def run_job(job: Job) -> Throughput | Latency | None:
    """Entry point of a child process."""
    logging.basicConfig(level=logging.WARNING)
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    return asyncio.run(_run_job(job))


def in_child(job: Job) -> Throughput | Latency | None:
    # Resolve the function through the importable module (this file may run as __main__).
    target: Callable[[Job], Throughput | Latency | None] = importlib.import_module(
        "bench.outbox"
    ).run_job
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(target, job).result()


# -- orchestration -------------------------------------------------------------------------


async def create_databases(server_url: str, systems: Sequence[str]) -> dict[str, str]:
    admin = await asyncpg.connect(asyncpg_dsn(server_url))
    urls: dict[str, str] = {}
    try:
        for name in systems:
            database = f"bench_{name}"
            await admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
            await admin.execute(f'CREATE DATABASE "{database}"')
            urls[name] = with_database(server_url, database)
    finally:
        await admin.close()
    return urls


async def server_version(server_url: str) -> str:
    conn = await asyncpg.connect(asyncpg_dsn(server_url))
    try:
        version = await conn.fetchval("SELECT version()")
    finally:
        await conn.close()
    return str(version)


def machine() -> str:
    """CPUs, CPU model, RAM, load and package versions: what a result line needs."""
    model = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    ram = "?"
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    versions = []
    for package in ("asyncpg", "pgqueuer", "procrastinate", "psycopg", "psycopg-pool"):
        try:
            versions.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{package} -")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{os.cpu_count()} CPUs ({model}), {ram} RAM, load average {load}; " + ", ".join(
        versions
    )


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "–"
    return f"{a / b:.2f}×"


def _num(value: float | None, digits: int = 0) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


Key = tuple[str, str, int]  # (mode, system, runners)


def render_table(
    systems: Sequence[str],
    throughput: dict[Key, list[Throughput]],
    latency: dict[str, Latency],
) -> str:
    """The summary: jobs/s (median over repeats) and latency percentiles, with ratios."""
    others = [s for s in systems if s != "ours"]
    header = ["Metric", *systems]
    if "ours" in systems:
        header += [f"ours / {o}" for o in others]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]

    def row(label: str, values: dict[str, float | None], digits: int) -> None:
        cells = [label, *(_num(values.get(s), digits) for s in systems)]
        if "ours" in systems:
            cells += [_ratio(values.get("ours"), values.get(o)) for o in others]
        lines.append("| " + " | ".join(cells) + " |")

    labels = {"drain": "Throughput", "mixed": "Insert while running"}
    for mode, runners in dict.fromkeys((m, r) for m, _, r in throughput):
        values: dict[str, float | None] = {}
        for s in systems:
            results = throughput.get((mode, s, runners))
            values[s] = statistics.median(r.jobs_per_second for r in results) if results else None
        plural = "s" if runners > 1 else ""
        row(f"{labels[mode]}, {runners} runner{plural} (jobs/s)", values, 0)
    if latency:
        row("Insert→start p50 (ms)", {s: latency[s].p50_ms for s in latency}, 2)
        row("Insert→start p99 (ms)", {s: latency[s].p99_ms for s in latency}, 2)
    return "\n".join(lines)


def render_details(throughput: dict[Key, list[Throughput]], latency: dict[str, Latency]) -> str:
    lines = [
        "| Mode | System | Runners | Jobs | Executed | Insert (s) | Timed (s) | Wall (s) "
        "| Jobs/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for t in (r for results in throughput.values() for r in results):
        lines.append(
            f"| {t.mode} | {t.system} | {t.runners} | {t.jobs} | {t.executed} "
            f"| {t.insert_seconds:.2f} | {t.drain_seconds:.3f} | {t.wall_seconds:.3f} "
            f"| {t.jobs_per_second:,.0f} |"
        )
    if latency:
        lines += [
            "",
            "| System | Samples | p50 (ms) | p99 (ms) | mean (ms) | max (ms) |",
            "|---|---|---|---|---|---|",
        ]
        for lat in latency.values():
            lines.append(
                f"| {lat.system} | {lat.samples} | {lat.p50_ms:.2f} | {lat.p99_ms:.2f} "
                f"| {lat.mean_ms:.2f} | {lat.max_ms:.2f} |"
            )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.outbox",
        description="No-op jobs end to end: ours vs pgqueuer vs procrastinate, one Postgres.",
    )
    parser.add_argument(
        "--jobs", type=int, default=20_000, help="jobs per throughput run (default 20000)"
    )
    parser.add_argument(
        "--runners", default="1,4,16", help="comma-separated runner counts (default 1,4,16)"
    )
    parser.add_argument(
        "--latency-samples", type=int, default=200, help="latency samples (0 to skip)"
    )
    parser.add_argument(
        "--latency-rounds",
        type=int,
        default=4,
        help="split the latency samples into this many rounds, systems taking turns (default 4)",
    )
    parser.add_argument(
        "--database-url",
        help="a Postgres server where bench_* databases may be (re)created; "
        "default: an embedded Postgres in a temporary directory",
    )
    parser.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help="comma-separated subset of " + ", ".join(SYSTEMS),
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=32,
        help="jobs one runner executes at once: ours, procrastinate (default 32)",
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=32,
        help="jobs claimed per round trip: ours (batch_size), pgqueuer (batch_size); "
        "procrastinate always fetches one (default 32)",
    )
    parser.add_argument(
        "--pgqueuer-cap",
        action="store_true",
        help="also cap pgqueuer with max_concurrent_tasks=max(concurrency, 2*batch); "
        "default: uncapped, pgqueuer's default",
    )
    parser.add_argument(
        "--ours-single-insert",
        action="store_true",
        help="insert our batches with enqueue() per row in transactions of 500 instead of "
        "one enqueue_many() statement per 500",
    )
    parser.add_argument(
        "--ours-default-planner",
        action="store_true",
        help="give our runners pools without the runner's planner settings (plan cache and "
        "enable_* flags), i.e. the runner as it was before them, for a before/after",
    )
    parser.add_argument(
        "--mixed-runners",
        type=int,
        default=4,
        help="runners of the insert-while-running measurement (default 4; 0 skips it)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="throughput runs per configuration; the table shows the median (default 1)",
    )
    parser.add_argument("--json", type=Path, help="also write raw results to this file")
    args = parser.parse_args(argv)
    args.runner_counts = [int(r) for r in args.runners.split(",") if r.strip()]
    args.system_names = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = set(args.system_names) - set(SYSTEMS)
    if unknown:
        parser.error(f"unknown systems: {', '.join(sorted(unknown))}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    logging.basicConfig(level=logging.WARNING)
    options = Options(
        concurrency=args.concurrency,
        batch=args.batch,
        pgqueuer_cap=args.pgqueuer_cap,
        ours_single_insert=args.ours_single_insert,
        ours_default_planner=args.ours_default_planner,
    )
    systems: list[str] = args.system_names
    with contextlib.ExitStack() as stack:
        server_url: str = args.database_url or ""
        if not server_url:
            # A throwaway server where databases may be created (superagent up's embedded
            # one admits only its application's role).
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-pg-")))
            server = get_server(tmp / "pg", cleanup_mode="stop")
            server_url = str(server.get_uri())
            stack.callback(server.cleanup)
        version = asyncio.run(server_version(server_url))
        urls = asyncio.run(create_databases(server_url, systems))
        print(f"# {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC", flush=True)
        print(f"# Postgres: {version}", flush=True)
        print(f"# Machine: {machine()}", flush=True)
        print(
            f"# Python {platform.python_version()}, jobs={args.jobs}, runners={args.runners}, "
            f"repeat={args.repeat}, "
            f"concurrency={args.concurrency}, batch={args.batch}, "
            f"pgqueuer cap={'on' if args.pgqueuer_cap else 'off'}"
            + (", ours: enqueue() per row" if args.ours_single_insert else "")
            + (", ours: default planner" if args.ours_default_planner else ""),
            flush=True,
        )
        for name in systems:
            in_child(Job("install", name, urls[name], options))

        latency: dict[str, Latency] = {}
        if args.latency_samples > 0:
            # In rounds, the systems taking turns, so a noisy moment hits all of them.
            rounds = max(1, min(args.latency_rounds, args.latency_samples))
            samples: dict[str, list[float]] = {name: [] for name in systems}
            for r in range(rounds):
                share = args.latency_samples // rounds + (r < args.latency_samples % rounds)
                for name in systems:
                    result = in_child(Job("latency", name, urls[name], options, samples=share))
                    assert isinstance(result, Latency)
                    samples[name].extend(result.raw_ms)
            for name in systems:
                latency[name] = summarize(name, samples[name])
                print(
                    f"latency {name}: p50 {latency[name].p50_ms:.2f} ms, "
                    f"p99 {latency[name].p99_ms:.2f} ms",
                    flush=True,
                )

        plan = [("throughput", r) for r in args.runner_counts]
        if args.mixed_runners > 0:
            plan.append(("mixed", args.mixed_runners))
        throughput: dict[Key, list[Throughput]] = {}
        for (mode, runners), _ in itertools.product(plan, range(args.repeat)):
            # Interleaved by runner count and repeat, so slow drift (autovacuum, page cache,
            # noisy neighbours) is shared by all systems.
            for name in systems:
                result = in_child(
                    Job(mode, name, urls[name], options, runners=runners, jobs=args.jobs)
                )
                assert isinstance(result, Throughput)
                throughput.setdefault((result.mode, name, runners), []).append(result)
                print(
                    f"{result.mode} {name} x{runners}: {result.jobs_per_second:,.0f} jobs/s "
                    f"({result.executed} executed in {result.drain_seconds:.2f}s, "
                    f"insert {result.insert_seconds:.2f}s)",
                    flush=True,
                )

        print()
        print(render_table(systems, throughput, latency))
        print()
        print(render_details(throughput, latency))
        if args.json:
            args.json.write_text(
                json.dumps(
                    {
                        "postgres": version,
                        "args": {k: str(v) for k, v in vars(args).items()},
                        "throughput": [
                            dataclasses.asdict(t) for ts in throughput.values() for t in ts
                        ],
                        "latency": [dataclasses.asdict(v) for v in latency.values()],
                    },
                    indent=2,
                )
            )
    return 0


if __name__ == "__main__":
    # Run the importable module's main, so results unpickled from child processes are
    # instances of the same classes (bench.outbox.*, not __main__.*).
    from bench.outbox import main as _main

    sys.exit(_main())
