"""Shared pieces of the device-gateway benchmarks: simulated devices and the processes they dial.

* :class:`SimDevice` is a lean, hand-written client of the real protocol (TLS with the
  gateway's pinned CA, Challenge → signed Hello, heartbeats at the interval the server asks
  for, Acks). Thousands of them run on one asyncio loop in the load-generator process. Each
  has its own channel and therefore its own TCP+TLS connection, as real devices do (the
  channels use a local subchannel pool, otherwise gRPC would share one connection among
  channels with the same target).
* ``python -m bench.simdevice serve gateway|baseline ...`` is the server side, always in a
  process of its own so that its RSS and CPU can be read from ``/proc`` (via psutil) without
  the load generator's: ``gateway`` is one real replica (``DeviceHub`` + ``GatewayService``
  with TLS, wired as ``controlplane.runtime`` does), ``baseline`` a bare ``grpc.aio`` server
  with the same options and certificate whose Connect only sends a Challenge and then reads
  and discards (after one "welcome" message, so clients know their Hello arrived).
  The child prints one JSON line (``{"port": ..., "pid": ...}``) when it listens and stops
  on SIGTERM.
* helpers for the orchestrating process: an embedded Postgres (the ``pgserver`` wheel, as
  ``superagent up`` uses), fresh migrated databases, devices paired for real (a public key
  per device, inserted directly or through pairing codes and the Pair RPC), process sampling
  and a machine description.

The controlplane imports are local to the functions that need them so that the baseline
process stays a bare gRPC server.

Diagnostics for a server process, by environment variable: ``BENCH_GC_STATS=SECONDS``
prints the time spent in each garbage-collector generation to stderr every SECONDS;
``BENCH_TRACEMALLOC=PATH`` traces Python allocations and writes the top ones to PATH on
SIGUSR1. Both perturb what they measure (tracemalloc a lot); never use them for the
reported figures.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import datetime
import json
import logging
import os
import platform
import random
import resource
import signal
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import psutil
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from google.protobuf.timestamp_pb2 import Timestamp

from superagent_proto.v1 import endpoint_pb2 as pb
from superagent_proto.v1 import endpoint_pb2_grpc
from superagent_shared.protocol import PROTOCOL_VERSION_NUMBER, hello_signing_payload

log = logging.getLogger("bench.simdevice")

REPO = Path(__file__).resolve().parent.parent
GATEWAY_NAME = "superagent-gateway"  # the name every gateway certificate carries (tls.py)
REPLICA_ID = "bench-replica"
KIB = 1024
MIB = 1024 * 1024
POLICY_HASH = b"\x01" * 32
DAEMON_VERSION = "bench"

# What endpointd's connection.py uses (KEEPALIVE_OPTIONS), so the server sees the same HTTP/2
# keepalive and flow-control traffic.
CLIENT_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.max_receive_message_length", 16 * 1024 * 1024),
    ("grpc.enable_retries", 0),
    ("grpc.http2.bdp_probe", 0),
    ("grpc.http2.lookahead_bytes", 4 << 20),
    ("grpc.ssl_target_name_override", GATEWAY_NAME),
    # One connection per channel, i.e. per device (the global pool would share them).
    ("grpc.use_local_subchannel_pool", 1),
]


# -- the environment ----------------------------------------------------------------------


def raise_nofile_limit() -> int:
    """Raise the soft open-file limit to the hard one; returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def code_version() -> str:
    """The checkout the gateway code comes from (the server processes run from REPO)."""
    import subprocess

    try:
        rev = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--", "controlplane/gateway"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return f"{REPO} (not a git checkout)"
    return f"{REPO} @ {rev}" + (" (controlplane/gateway modified)" if dirty else "")


def machine_summary(postgres_version: str) -> list[tuple[str, str]]:
    memory = psutil.virtual_memory().total
    return [
        ("code", code_version()),
        ("date (UTC)", f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M}"),
        ("CPU", f"{os.cpu_count()} × {_cpu_model()} (nproc {len(os.sched_getaffinity(0))})"),
        ("RAM", f"{memory / 2**30:.1f} GiB"),
        ("kernel", platform.release()),
        ("Python", platform.python_version()),
        ("grpcio", grpc.__version__),
        ("Postgres", postgres_version),
        ("load average at start", " ".join(f"{x:.2f}" for x in os.getloadavg())),
        ("open-file limit (soft)", str(resource.getrlimit(resource.RLIMIT_NOFILE)[0])),
    ]


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


@contextlib.contextmanager
def postgres_server(database_url: str | None) -> Iterator[str]:
    """A Postgres server URL where a benchmark may create databases: ``database_url``, or a
    throwaway pgserver in a temporary dir (as the test suite's; ``superagent up``'s
    embedded server admits only its application's role, which creates no databases)."""
    if database_url:
        yield database_url
        return
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    from pgserver.postgres_server import get_server

    with tempfile.TemporaryDirectory(prefix="bench-gateway-pg-") as tmp:
        server = get_server(Path(tmp) / "pg", cleanup_mode="stop")
        try:
            yield str(server.get_uri())
        finally:
            server.cleanup()


async def fresh_database(server_url: str, name: str) -> str:
    """Drop and recreate database ``name`` on the server, migrate it, return its URL."""
    import asyncpg

    from controlplane.db import migrate
    from controlplane.db.urls import asyncpg_dsn
    from tests.support.database import with_database

    admin = await asyncpg.connect(asyncpg_dsn(server_url))
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    url = with_database(server_url, name)
    await migrate.upgrade(url)
    return url


async def postgres_version(url: str) -> str:
    import asyncpg

    from controlplane.db.urls import asyncpg_dsn

    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        return str(await conn.fetchval("SHOW server_version"))
    finally:
        await conn.close()


async def postmaster_pid(url: str) -> int | None:
    """The Postgres server's main process (the parent of every backend), if it is local."""
    import asyncpg

    from controlplane.db.urls import asyncpg_dsn

    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        backend = int(await conn.fetchval("SELECT pg_backend_pid()"))
        try:
            return psutil.Process(backend).ppid()  # while the backend still exists
        except psutil.Error:
            return None
    finally:
        await conn.close()


# -- devices --------------------------------------------------------------------------------


@dataclasses.dataclass
class Identity:
    device_id: str
    name: str
    key: Ed25519PrivateKey

    @property
    def public_key(self) -> bytes:
        return self.key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


async def insert_devices(url: str, count: int, prefix: str = "sim") -> list[Identity]:
    """Pair ``count`` devices by writing what Pair would: a row with the device's public key."""
    import asyncpg

    from controlplane.db.urls import asyncpg_dsn
    from superagent_shared.ids import new_id

    identities = [
        Identity(new_id("dev"), f"{prefix}-{i:05d}", Ed25519PrivateKey.generate())
        for i in range(count)
    ]
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        await conn.copy_records_to_table(
            "devices",
            records=[
                (d.device_id, d.name, "bench", d.public_key, DAEMON_VERSION) for d in identities
            ],
            columns=["id", "name", "owner", "public_key", "version"],
        )
    finally:
        await conn.close()
    return identities


async def pair_devices(
    url: str, server: ServerProcess, count: int, prefix: str = "sim", concurrency: int = 16
) -> list[Identity]:
    """Pair for real: pairing codes from ``pairing.create_code``, redeemed with the Pair RPC."""
    import asyncpg

    from controlplane.db.pool import transaction
    from controlplane.db.urls import asyncpg_dsn
    from controlplane.gateway import pairing

    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        async with transaction(conn) as inside:
            codes = [
                (
                    await pairing.create_code(
                        inside, device_name=f"{prefix}-{i:05d}", owner="bench", created_by="bench"
                    )
                ).display
                for i in range(count)
            ]
    finally:
        await conn.close()
    identities: list[Identity | None] = [None] * count
    gate = asyncio.Semaphore(concurrency)
    async with server.channel(shared=True) as channel:
        stub = endpoint_pb2_grpc.EndpointGatewayStub(channel)

        async def pair(index: int) -> None:
            key = Ed25519PrivateKey.generate()
            async with gate:
                response = await stub.Pair(
                    pb.PairRequest(
                        pairing_code=codes[index],
                        device_name=f"{prefix}-{index:05d}",
                        public_key=key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw),
                        daemon_version=DAEMON_VERSION,
                        protocol_version=PROTOCOL_VERSION_NUMBER,
                        platform="linux",
                        hostname="bench",
                    )
                )
            identities[index] = Identity(response.device_id, f"{prefix}-{index:05d}", key)

        await asyncio.gather(*(pair(i) for i in range(count)))
    return [identity for identity in identities if identity is not None]


# -- server processes -----------------------------------------------------------------------


class ServerProcess:
    """A gateway or baseline server in its own process, and readings of its RSS and CPU."""

    def __init__(
        self, kind: str, process: asyncio.subprocess.Process, port: int, ca_pem: bytes | None
    ) -> None:
        self.kind = kind
        self.process = process
        self.port = port
        self.ca_pem = ca_pem  # None: plaintext
        self.ps = psutil.Process(process.pid)
        self.credentials = (
            grpc.ssl_channel_credentials(root_certificates=ca_pem) if ca_pem is not None else None
        )

    @classmethod
    async def start(
        cls,
        kind: str,
        *,
        database_url: str,
        tls_dir: Path,
        heartbeat_seconds: float,
        tls: bool = True,
        extra: Sequence[str] = (),
    ) -> ServerProcess:
        from controlplane.gateway.tls import ensure_server_tls

        material = ensure_server_tls(tls_dir)  # created here once; the child loads the files
        if not tls:
            extra = [*extra, "--plaintext"]
        if kind == "baseline":
            extra = [*extra, "--grpc-options", json.dumps(gateway_options(heartbeat_seconds))]
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.simdevice",
            "serve",
            kind,
            "--database-url",
            database_url,
            "--tls-dir",
            str(tls_dir),
            "--heartbeat-seconds",
            str(heartbeat_seconds),
            *extra,
            cwd=REPO,
            stdin=asyncio.subprocess.PIPE,  # closed when this process dies: the child stops
            stdout=asyncio.subprocess.PIPE,
        )
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), 120)
        if not line:
            raise RuntimeError(f"the {kind} server exited before listening")
        ready = json.loads(line)
        return cls(kind, process, int(ready["port"]), material.ca_pem if tls else None)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def channel(self, *, shared: bool = False) -> Any:
        options = CLIENT_OPTIONS if not shared else CLIENT_OPTIONS[:-1]
        if self.credentials is None:
            return grpc.aio.insecure_channel(self.target, options=options)
        return grpc.aio.secure_channel(self.target, self.credentials, options=options)

    def rss(self) -> int:
        return int(self.ps.memory_info().rss)

    def cpu_seconds(self) -> float:
        times = self.ps.cpu_times()
        return float(times.user + times.system)

    def threads(self) -> int:
        return int(self.ps.num_threads())

    def thread_cpu_seconds(self) -> dict[str, float]:
        """CPU seconds by thread: the event loop's ("main") and gRPC's own, by thread name."""
        out: dict[str, float] = collections.defaultdict(float)
        for thread in self.ps.threads():
            if thread.id == self.ps.pid:
                name = "main"
            else:
                try:
                    name = Path(f"/proc/{self.ps.pid}/task/{thread.id}/comm").read_text().strip()
                except OSError:
                    continue
            out[name] += thread.user_time + thread.system_time
        return dict(out)

    def open_files(self) -> int:
        return int(self.ps.num_fds())

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), 30)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()


def tree_cpu_seconds(pid: int | None) -> float:
    """CPU seconds of a process and its living children (e.g. Postgres and its backends)."""
    total = 0.0
    if pid is None:
        return total
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                times = proc.cpu_times()
                total += times.user + times.system
    return total


def own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


async def median_rss(server: ServerProcess, samples: int = 5, spacing: float = 0.2) -> int:
    values = []
    for _ in range(samples):
        values.append(server.rss())
        await asyncio.sleep(spacing)
    return int(statistics.median(values))


class PeakSampler:
    """Samples a process's RSS every ``interval`` seconds in the background; keeps the peak."""

    def __init__(self, server: ServerProcess, interval: float = 0.05) -> None:
        self.server = server
        self.interval = interval
        self.peak = 0
        self.samples: list[int] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            rss = self.server.rss()
            self.samples.append(rss)
            self.peak = max(self.peak, rss)
            await asyncio.sleep(self.interval)

    def __enter__(self) -> PeakSampler:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
        with contextlib.suppress(psutil.Error):
            rss = self.server.rss()
            self.samples.append(rss)
            self.peak = max(self.peak, rss)


# -- the simulated device -------------------------------------------------------------------


def _now() -> Timestamp:
    stamp = Timestamp()
    stamp.FromNanoseconds(time.time_ns())
    return stamp


CommandHandler = Callable[["SimDevice", pb.Command], Awaitable[None]]


class SimDevice:
    """One device's Connect stream, spoken by hand and kept small."""

    def __init__(
        self,
        identity: Identity,
        server: ServerProcess,
        on_command: CommandHandler | None = None,
    ) -> None:
        self.identity = identity
        self.server = server
        self.on_command = on_command
        self.deliveries: collections.Counter[str] = collections.Counter()
        self.acked: dict[str, int] = {}
        self.finished_acks: set[str] = set()
        self.heartbeats_received = 0
        self.heartbeat_seconds = 15.0
        self.welcomed = asyncio.Event()  # any server message after the Challenge
        self.ended = asyncio.Event()
        self.status: Any = None  # grpc.StatusCode once the stream ended
        self.details = ""
        self._ack_changed = asyncio.Event()
        self._channel: Any = None
        self._call: Any = None
        self._write_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._sent_heartbeats = 0
        self._peer_seq = 0

    @property
    def device_id(self) -> str:
        return self.identity.device_id

    def _spawn(self, coro: Awaitable[None], name: str) -> None:
        async def wrapped() -> None:
            await coro

        task = asyncio.get_running_loop().create_task(wrapped(), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("%s: %s failed: %r", self.device_id, task.get_name(), task.exception())

    async def connect(self, in_flight: Sequence[pb.InFlight] = ()) -> None:
        """Open the stream, answer the Challenge with a signed Hello, start reading."""
        self.welcomed = asyncio.Event()
        self.ended = asyncio.Event()
        self.status = None
        self._channel = self.server.channel()
        stub = endpoint_pb2_grpc.EndpointGatewayStub(self._channel)
        self._call = stub.Connect()
        first = await self._call.read()
        if first is grpc.aio.EOF or first.WhichOneof("msg") != "challenge":
            raise RuntimeError(f"{self.device_id}: no Challenge ({first!r})")
        challenge = first.challenge
        self.heartbeat_seconds = float(challenge.heartbeat_interval_seconds or 15)
        signature = self.identity.key.sign(
            hello_signing_payload(
                nonce=challenge.nonce,
                device_id=self.device_id,
                daemon_version=DAEMON_VERSION,
                protocol_version=PROTOCOL_VERSION_NUMBER,
                policy_hash=POLICY_HASH,
            )
        )
        await self.write(
            pb.DeviceMessage(
                hello=pb.Hello(
                    device_id=self.device_id,
                    daemon_version=DAEMON_VERSION,
                    protocol_version=PROTOCOL_VERSION_NUMBER,
                    signature=signature,
                    in_flight=list(in_flight),
                    policy_hash=POLICY_HASH,
                )
            )
        )
        self._spawn(self._read_loop(), f"{self.device_id}:read")
        self._spawn(self._heartbeat_loop(), f"{self.device_id}:heartbeat")

    async def write(self, message: pb.DeviceMessage) -> None:
        async with self._write_lock:  # gRPC writes must not overlap
            await self._call.write(message)

    async def _read_loop(self) -> None:
        call = self._call
        try:
            while (message := await call.read()) is not grpc.aio.EOF:
                self.welcomed.set()
                kind = message.WhichOneof("msg")
                if kind == "heartbeat":
                    self.heartbeats_received += 1
                    self._peer_seq = max(self._peer_seq, message.heartbeat.seq)
                elif kind == "ack":
                    ack = message.ack
                    if ack.acked_output_offset > self.acked.get(ack.command_id, -1):
                        self.acked[ack.command_id] = ack.acked_output_offset
                    if ack.finished:
                        self.finished_acks.add(ack.command_id)
                    self._ack_changed.set()
                elif kind == "command":
                    command = message.command
                    self.deliveries[command.command_id] += 1
                    if self.on_command is not None:
                        self._spawn(self.on_command(self, command), f"{command.command_id}:run")
        except grpc.aio.AioRpcError as err:
            self.status = err.code()
            self.details = err.details() or ""
        except asyncio.CancelledError:
            self.status = grpc.StatusCode.CANCELLED
            raise
        else:
            self.status = grpc.StatusCode.OK
        finally:
            self.ended.set()
            self._ack_changed.set()

    async def _heartbeat_loop(self) -> None:
        # A random phase, as devices that connected at different times would have.
        await asyncio.sleep(random.uniform(0, self.heartbeat_seconds))
        while not self.ended.is_set():
            self._sent_heartbeats += 1
            await self.write(
                pb.DeviceMessage(
                    heartbeat=pb.Heartbeat(
                        seq=self._sent_heartbeats, sent_at=_now(), ack_seq=self._peer_seq
                    )
                )
            )
            await asyncio.sleep(self.heartbeat_seconds)

    async def wait_acked(self, command_id: str, offset: int) -> None:
        """Until the server acknowledged output up to ``offset`` (or the stream ended)."""
        while self.acked.get(command_id, 0) < offset and not self.ended.is_set():
            self._ack_changed.clear()
            await self._ack_changed.wait()

    async def wait_finished_ack(self, command_id: str) -> None:
        while command_id not in self.finished_acks and not self.ended.is_set():
            self._ack_changed.clear()
            await self._ack_changed.wait()

    async def close(self) -> None:
        if self._call is not None:
            self._call.cancel()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._channel is not None:
            await self._channel.close()
        self._channel = self._call = None


async def connect_all(devices: Sequence[SimDevice], concurrency: int) -> float:
    """Connect every device, ``concurrency`` handshakes at a time; returns the seconds taken."""
    gate = asyncio.Semaphore(concurrency)

    async def one(device: SimDevice) -> None:
        async with gate:
            await device.connect()

    started = time.perf_counter()
    await asyncio.gather(*(one(d) for d in devices))
    return time.perf_counter() - started


async def close_all(devices: Sequence[SimDevice], concurrency: int = 500) -> None:
    gate = asyncio.Semaphore(concurrency)

    async def one(device: SimDevice) -> None:
        async with gate:
            await device.close()

    await asyncio.gather(*(one(d) for d in devices))


async def wait_connected_in_db(url: str, count: int, timeout: float = 300) -> float:
    """Until ``count`` devices are held by the gateway replica (set by its handshake)."""
    import asyncpg

    from controlplane.db.urls import asyncpg_dsn

    started = time.perf_counter()
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        while True:
            held = await conn.fetchval(
                "SELECT count(*) FROM devices WHERE connected_replica = $1", REPLICA_ID
            )
            if held >= count:
                return time.perf_counter() - started
            if time.perf_counter() - started > timeout:
                raise TimeoutError(f"only {held} of {count} devices connected")
            await asyncio.sleep(0.05)
    finally:
        await conn.close()


# -- the server side (runs in the child process) ---------------------------------------------


class BareGateway(endpoint_pb2_grpc.EndpointGatewayServicer):
    """The baseline: holds Connect streams and does nothing else."""

    def __init__(self, heartbeat_seconds: float) -> None:
        self.heartbeat_seconds = heartbeat_seconds

    async def Pair(self, request: pb.PairRequest, context: Any) -> pb.PairResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "the baseline does not pair")
        raise AssertionError("unreachable")

    async def Connect(  # type: ignore[override]
        self, request_iterator: object, context: Any
    ) -> None:
        await context.write(
            pb.ServerMessage(
                challenge=pb.Challenge(
                    nonce=os.urandom(32),
                    protocol_version=PROTOCOL_VERSION_NUMBER,
                    heartbeat_interval_seconds=max(1, round(self.heartbeat_seconds)),
                )
            )
        )
        if await context.read() is grpc.aio.EOF:
            return
        await context.write(pb.ServerMessage(heartbeat=pb.Heartbeat(seq=0)))  # "welcome"
        while await context.read() is not grpc.aio.EOF:
            pass


def _grpc_settings(heartbeat_seconds: float) -> Any:
    from controlplane.settings import GrpcSettings

    return GrpcSettings(host="127.0.0.1", port=0, heartbeat_seconds=heartbeat_seconds)


def gateway_options(heartbeat_seconds: float) -> list[tuple[str, int]]:
    """The exact options the gateway's gRPC server uses (keepalive, max age, message size)."""
    from controlplane.gateway.server import GatewayService

    service = GatewayService(_grpc_settings(heartbeat_seconds), gateway=None)  # type: ignore[arg-type]
    return service._options()


async def _serve_baseline(args: argparse.Namespace, stop: asyncio.Event) -> None:
    tls = Path(args.tls_dir)  # written by controlplane.gateway.tls in the parent
    cert_chain = (tls / "server.pem").read_bytes() + (tls / "ca.pem").read_bytes()
    # The gateway's options, computed by the parent: this process imports no controlplane code.
    options = [(str(k), int(v)) for k, v in json.loads(args.grpc_options)]
    server = grpc.aio.server(options=options)
    endpoint_pb2_grpc.add_EndpointGatewayServicer_to_server(
        BareGateway(args.heartbeat_seconds), server
    )
    if args.plaintext:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        port = server.add_secure_port(
            "127.0.0.1:0",
            grpc.ssl_server_credentials([((tls / "server.key").read_bytes(), cert_chain)]),
        )
    await server.start()
    print(json.dumps({"port": port, "pid": os.getpid()}), flush=True)
    await stop.wait()
    await server.stop(grace=1.0)


async def _serve_gateway(args: argparse.Namespace, stop: asyncio.Event) -> None:
    from controlplane.db.urls import asyncpg_dsn
    from controlplane.effects.runner import create_pool
    from controlplane.gateway.delivery import CommandDelivery
    from controlplane.gateway.hub import DeviceHub
    from controlplane.gateway.server import EndpointGateway, GatewayService
    from controlplane.gateway.tls import ensure_server_tls

    settings = _grpc_settings(args.heartbeat_seconds)
    tls = None if args.plaintext else ensure_server_tls(Path(args.tls_dir))
    dsn = asyncpg_dsn(args.database_url)
    pool = await create_pool(dsn, size=10)  # the gateway bench's pool (bench/RESULTS.md)
    delivery = CommandDelivery(pool, inline=settings.output_inline_bytes)
    hub = DeviceHub(dsn, delivery, REPLICA_ID)
    gateway = EndpointGateway(pool, delivery, hub, settings, tls, "bench")
    service = GatewayService(settings, gateway)
    await hub.start()
    await service.start()
    while service.port is None:  # noqa: ASYNC110 - the port appears once, right after bind
        await asyncio.sleep(0.01)
    print(json.dumps({"port": service.port, "pid": os.getpid()}), flush=True)
    try:
        await stop.wait()
    finally:
        await service.stop(10)
        await hub.stop(10)
        await pool.close()


def _enable_tracemalloc(loop: asyncio.AbstractEventLoop, path: Path) -> None:
    import tracemalloc

    tracemalloc.start(12)

    def dump() -> None:
        snapshot = tracemalloc.take_snapshot()
        lines = [f"total {sum(s.size for s in snapshot.statistics('filename'))}"]
        lines += [str(stat) for stat in snapshot.statistics("lineno")[:40]]
        for stat in snapshot.statistics("traceback")[:12]:
            lines += [str(stat), *("    " + line for line in stat.traceback.format())]
        path.write_text("\n".join(lines) + "\n")

    loop.add_signal_handler(signal.SIGUSR1, dump)


def _report_gc(loop: asyncio.AbstractEventLoop, every: float) -> None:
    import gc

    spent = [0.0, 0.0, 0.0]
    count = [0, 0, 0]
    started = [0.0]

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            spent[info["generation"]] += time.perf_counter() - started[0]
            count[info["generation"]] += 1

    gc.callbacks.append(callback)

    def report() -> None:
        print(
            "gc: "
            + ", ".join(f"gen{g} {count[g]}× {spent[g] * 1000:.0f} ms" for g in range(3))
            + f", {len(gc.get_objects())} tracked objects",
            file=sys.stderr,
            flush=True,
        )
        loop.call_later(every, report)

    loop.call_later(every, report)


def serve_main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.simdevice serve")
    parser.add_argument("kind", choices=["gateway", "baseline"])
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--tls-dir", required=True)
    parser.add_argument("--heartbeat-seconds", type=float, default=15.0)
    parser.add_argument("--grpc-options", default="[]", help="baseline: JSON [[name, value]]")
    parser.add_argument("--plaintext", action="store_true", help="no TLS (as behind a proxy)")
    args = parser.parse_args(argv)
    raise_nofile_limit()
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    logging.basicConfig(level=logging.WARNING, format=f"[{args.kind}] %(levelname)s %(message)s")

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)

        def parent_gone() -> None:  # stdin is a pipe from the parent: EOF when it exits
            if not os.read(sys.stdin.fileno(), 1024):
                loop.remove_reader(sys.stdin.fileno())
                stop.set()

        with contextlib.suppress(OSError, ValueError):  # not a pipe when run by hand
            loop.add_reader(sys.stdin.fileno(), parent_gone)
        if os.environ.get("BENCH_TRACEMALLOC"):  # diagnostics: SIGUSR1 dumps Python allocations
            _enable_tracemalloc(loop, Path(os.environ["BENCH_TRACEMALLOC"]))
        if os.environ.get("BENCH_GC_STATS"):  # diagnostics: time in the garbage collector
            _report_gc(loop, float(os.environ["BENCH_GC_STATS"]))
        if args.kind == "gateway":
            await _serve_gateway(args, stop)
        else:
            await _serve_baseline(args, stop)

    asyncio.run(main())
    return 0


@contextlib.asynccontextmanager
async def running_server(
    kind: str, *, database_url: str, tls_dir: Path, heartbeat_seconds: float, tls: bool = True
) -> AsyncIterator[ServerProcess]:
    server = await ServerProcess.start(
        kind,
        database_url=database_url,
        tls_dir=tls_dir,
        heartbeat_seconds=heartbeat_seconds,
        tls=tls,
    )
    try:
        yield server
    finally:
        await server.stop()


if __name__ == "__main__":
    if sys.argv[1:2] != ["serve"]:
        sys.exit("usage: python -m bench.simdevice serve gateway|baseline ...")
    sys.exit(serve_main(sys.argv[2:]))
