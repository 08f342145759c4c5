"""Fast-path ingest: a signed GitHub webhook to a subscribed ticket's inbox, with NOTIFY.

Run by hand (never in CI)::

    python -m bench.ingest_fastpath [--events 4000] [--senders 4] [--database-url URL]

Two servers, each in its own process, measured one after the other in the same run:

* **superagent**: the real control plane, ``python -m controlplane.cli serve`` with a
  webhook secret, on an embedded Postgres. The thread ``acme/app#1`` has a ticket
  subscribed to it, so every delivery takes the fast path:
  signature check → JSON → thread upsert → dedupe insert of the trigger and its payload →
  the ticket's inbox → NOTIFY. The benchmark LISTENs on ``superagent_inbox`` and times each
  event until its notification arrives.
* **floor**: a bare FastAPI endpoint under the same uvicorn, which only inserts the raw
  body into a table (one statement on an asyncpg pool) and answers 202.

``--senders`` concurrent senders post signed ``issue_comment`` deliveries (a new delivery
id each) over keep-alive HTTP/1.1. They use a minimal asyncio client, so that the load
generator takes as little as possible of the two CPUs from the servers. Reported: events
per second, p50 and p99 latency, and CPU per event: the server process and Postgres, from
``/proc``. Goal: ≥ 1,000 events/s, and a per-event cost within 2.5× of the floor's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import asyncpg
import psutil
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from bench.simdevice import (
    fresh_database,
    machine_summary,
    markdown_table,
    postgres_server,
    postgres_version,
    postmaster_pid,
    tree_cpu_seconds,
)
from controlplane.channels.github.events import sign
from controlplane.db.urls import asyncpg_dsn
from controlplane.domain import Notify
from superagent_shared.ids import new_id
from tests.support.helpers import free_port

SECRET = b"bench-webhook-secret-91"


def _delivery(n: int) -> bytes:
    return json.dumps(
        {
            "action": "created",
            "issue": {"number": 1, "title": "Flaky test", "html_url": "https://x/1"},
            "comment": {
                "id": n,
                "body": f"CI run {n}: 3 tests failed in module {n % 17}; see the log.",
                "user": {"login": "ci-reporter", "id": 77, "type": "User"},
            },
            "repository": {"full_name": "acme/app", "id": 1},
            "sender": {"login": "ci-reporter", "id": 77, "type": "User"},
        }
    ).encode()


class Client:
    """One keep-alive HTTP/1.1 connection; just enough protocol for these two servers."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        assert self.reader is not None
        head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        self.writer.write(head.encode() + body)
        status_line = await self.reader.readline()
        length = 0
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        data = await self.reader.readexactly(length)
        return int(status_line.split()[1]), data

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def _load(
    port: int,
    path: str,
    events: int,
    senders: int,
    start_at: int,
    signed: bool,
    sent_at: dict[str, float],
    took: list[float],
) -> float:
    """Send ``events`` deliveries from ``senders`` connections; wall seconds."""
    counter = iter(range(start_at, start_at + events))

    async def sender() -> None:
        client = Client(port)
        try:
            for n in counter:
                body = _delivery(n)
                headers = {"Content-Type": "application/json"}
                if signed:
                    headers |= {
                        "X-GitHub-Event": "issue_comment",
                        "X-GitHub-Delivery": f"bench-{n}",
                        "X-Hub-Signature-256": sign(SECRET, body),
                    }
                began = time.monotonic()
                status, data = await client.post(path, body, headers)
                took.append(time.monotonic() - began)
                if status != 202:
                    raise RuntimeError(f"{path}: {status} {data[:300]!r}")
                if signed:
                    sent_at[json.loads(data)["triggers"][0]["id"]] = began
        finally:
            client.close()

    started = time.monotonic()
    await asyncio.gather(*(sender() for _ in range(senders)))
    return time.monotonic() - started


def _floor_app(dsn: str) -> FastAPI:
    app = FastAPI()
    pools: list[asyncpg.Pool] = []

    @app.on_event("startup")
    async def startup() -> None:
        pool = await asyncpg.create_pool(dsn, min_size=4, max_size=10)
        assert pool is not None
        pools.append(pool)

    @app.post("/hook")
    async def hook(request: Request) -> JSONResponse:
        body = await request.body()
        await pools[0].execute("INSERT INTO raw_events (body) VALUES ($1)", body)
        return JSONResponse({"ok": True}, status_code=202)

    return app


def serve_floor(argv: list[str]) -> None:
    import uvicorn

    port, dsn = int(argv[0]), argv[1]
    uvicorn.run(_floor_app(dsn), host="127.0.0.1", port=port, log_config=None, access_log=False)


async def _wait_http(port: int, path: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"nothing listens on {port}")


def _spawn(argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, env=env)


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _measure(
    name: str,
    process: subprocess.Popen[bytes],
    port: int,
    path: str,
    args: argparse.Namespace,
    pg_pid: int | None,
    signed: bool,
    url: str,
) -> list[object]:
    await _wait_http(port, path)
    listener = await asyncpg.connect(asyncpg_dsn(url))
    arrived: dict[str, float] = {}

    def on_inbox(_c: object, _p: int, _ch: str, payload: object) -> None:
        arrived[str(payload).partition(":")[0]] = time.monotonic()

    await listener.add_listener(Notify.INBOX, on_inbox)
    sent: dict[str, float] = {}
    took: list[float] = []
    await _load(port, path, args.warmup, args.senders, 0, signed, sent, took)
    server = psutil.Process(process.pid)
    server_cpu = sum(server.cpu_times()[:2])
    pg_cpu = tree_cpu_seconds(pg_pid)
    sent.clear()
    took.clear()
    arrived.clear()
    wall = await _load(port, path, args.events, args.senders, 10**6, signed, sent, took)
    server_cpu = sum(server.cpu_times()[:2]) - server_cpu
    pg_cpu = tree_cpu_seconds(pg_pid) - pg_cpu
    await asyncio.sleep(0.5)
    await listener.close()
    if signed:
        latencies = [arrived[t] - s for t, s in sent.items() if t in arrived]
        missing = len(sent) - len(latencies)
    else:
        latencies, missing = took, 0
    events = args.events
    return [
        name,
        events,
        f"{events / wall:,.0f}",
        f"{statistics.median(latencies) * 1000:.2f}",
        f"{_percentile(latencies, 0.99) * 1000:.2f}",
        f"{server_cpu / events * 1000:.3f}",
        f"{pg_cpu / events * 1000:.3f}",
        f"{(server_cpu + pg_cpu) / events * 1000:.3f}",
        missing,
    ]


async def main(args: argparse.Namespace) -> None:
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    with postgres_server(args.database_url) as server_url:
        url = await fresh_database(server_url, "bench_ingest_fastpath")
        for key, value in machine_summary(await postgres_version(url)):
            print(f"- {key}: {value}")
        conn = await asyncpg.connect(asyncpg_dsn(url))
        try:
            await conn.execute("CREATE TABLE raw_events (id bigserial PRIMARY KEY, body bytea)")
            thread, ticket = new_id("thr"), new_id("tkt")
            await conn.execute(
                "INSERT INTO threads (id, source, external_id) VALUES ($1, 'github', 'acme/app#1')",
                thread,
            )
            await conn.execute(
                "INSERT INTO tickets (id, title, state) VALUES ($1, 'bench', 'running')", ticket
            )
            await conn.execute(
                "INSERT INTO subscriptions (thread_id, ticket_id) VALUES ($1, $2)", thread, ticket
            )
        finally:
            await conn.close()
        pg_pid = await postmaster_pid(url)
        rows = []
        with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
            port = free_port()
            env = {
                **os.environ,
                "DATABASE_URL": url,
                "SUPERAGENT_STATE_DIR": str(Path(tmp) / "state"),
                "SUPERAGENT_HTTP__PORT": str(port),
                "SUPERAGENT_GRPC__PORT": str(free_port()),
                "SUPERAGENT_GITHUB__WEBHOOK_SECRET": SECRET.decode(),
                "SUPERAGENT_LOG_LEVEL": "WARNING",
            }
            for key in ("OPENAI_BASE_URL", "OPENAI_API_KEY"):
                env.pop(key, None)
            product = _spawn([sys.executable, "-m", "controlplane.cli", "serve"], env)
            try:
                rows.append(
                    await _measure(
                        "superagent: webhook → inbox + NOTIFY",
                        product,
                        port,
                        "/webhooks/github",
                        args,
                        pg_pid,
                        True,
                        url,
                    )
                )
            finally:
                _stop(product)
            floor_port = free_port()
            floor = _spawn(
                [
                    sys.executable,
                    "-m",
                    "bench.ingest_fastpath",
                    "serve-floor",
                    str(floor_port),
                    asyncpg_dsn(url),
                ],
                dict(os.environ),
            )
            try:
                rows.append(
                    await _measure(
                        "floor: bare FastAPI insert",
                        floor,
                        floor_port,
                        "/hook",
                        args,
                        pg_pid,
                        False,
                        url,
                    )
                )
            finally:
                _stop(floor)
        print()
        print(
            markdown_table(
                [
                    "system",
                    "events",
                    "events/s",
                    "p50 ms",
                    "p99 ms",
                    "server CPU ms/event",
                    "Postgres CPU ms/event",
                    "total CPU ms/event",
                    "lost",
                ],
                rows,
            )
        )
        ours, base = float(str(rows[0][7])), float(str(rows[1][7]))
        print(f"\nper-event cost vs the floor: {ours / base:.2f}× (goal ≤ 2.5×)")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.ingest_fastpath")
    parser.add_argument("--events", type=int, default=4000)
    parser.add_argument("--warmup", type=int, default=400)
    parser.add_argument("--senders", type=int, default=4)
    parser.add_argument("--database-url", help="a Postgres server (default: embedded pgserver)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve-floor"]:
        serve_floor(sys.argv[2:])
    else:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(main(parse_args(sys.argv[1:])))
