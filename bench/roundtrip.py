"""Command round trip: ``true`` from submit to a result recorded in Postgres, for one device.

Run by hand (never in CI), from the repository root::

    python -m bench.roundtrip [--n 300] [--concurrency 8] [--profile DIR]

Everything runs on this machine, side by side in one run:

* **superagent + endpointd**: an embedded Postgres (the ``pgserver`` wheel, as in
  ``superagent up``) in a temporary directory, migrated; the gateway in its own process
  (``python -m controlplane.cli serve`` with ``DATABASE_URL``, ``SUPERAGENT_STATE_DIR``,
  ``SUPERAGENT_GRPC__PORT``, ``SUPERAGENT_HTTP__PORT``: TLS with its own CA, as deployed);
  a real ``endpointd`` paired with ``endpointd pair https://127.0.0.1:PORT CODE --key-file
  … --fingerprint …`` and started with ``endpointd run``. This process is the worker: one
  round trip is ``CommandQueue.submit(device, Exec(["true"]))`` then ``CommandQueue.wait()``
  until the result is final, and only ``state = finished, exit_code = 0`` counts.
* **superagent + instant device**: the same gateway and queue, but the device is a minimal
  protocol client in this process (paired with the Pair RPC, signed Hello) that answers
  every Command at once with ``Accepted`` and ``Finished(exit 0)``: the control plane's
  share of the round trip, without anything being executed.
* **ssh, reused master**: a private ``sshd`` on a loopback port (own host key, a key pair
  generated for the run, ``PermitRootLogin prohibit-password``, ``UsePAM no``), a master
  started with ``ssh -o ControlMaster=yes -o ControlPath=<tmp>/cm -o ControlPersist=60``,
  then ``ssh -o ControlPath=<tmp>/cm -p PORT root@127.0.0.1 true`` per round trip (a new
  ``ssh`` process each time, which is what people run today). ``openssh-server`` is
  installed with ``apt-get install -y openssh-server`` when ``/usr/sbin/sshd`` is missing
  and we are root (``--no-install`` skips ssh instead). sshd runs the command with the
  user's login shell, and Debian's bash sources ``~/.bashrc`` for ssh commands, so the
  root row pays for whatever root's ``.bashrc`` does; a second row logs in as a throwaway
  account (``useradd``, shell ``/bin/sh``, removed at the end) to show ssh's own cost, and
  the ratios are taken against that one.
* **bare grpc.aio ping-pong** (the floor): a generic bytes-in/bytes-out bidirectional
  stream (no protobuf, identity serializers, plaintext) served by a separate process on
  loopback; one round trip is ``write(16 bytes)`` then ``read()`` on an open stream.

**prepare_workspace** (``--workspaces N``, default 10; ``--workspaces-only`` runs just
this): a repository of ``--workspace-files`` files (default 10,000) in the real endpointd's
allowed root, its origin a local bare repository behind an https URL (``insteadOf``); one
round trip is ``CommandQueue.submit(device, PrepareWorkspace(ticket, repo, path))`` then
``wait()`` (a fetch of the default branch, ``git worktree add`` of all the files, the
record), against ``git worktree add`` of the same commit run by hand (a subprocess timed
from this process), the two back to back, alternating which goes first. Each workspace is
removed again between rounds (untimed: a ReleaseWorkspace with ``retention_hours = 0``, and
``git worktree remove`` for the hand-made one).

Each system gets ``--warmup`` untimed round trips, then (a) ``--n`` sequential round trips
(p50/p99 of each) and (b) ``--n`` round trips by ``--concurrency`` concurrent submitters
(separate ssh processes / separate streams for the baselines); ops/s = n / wall time of (b).

For the superagent rows it also reports where the time goes, per stage, from timestamps
that are already recorded: the worker's own clock around ``submit`` and ``wait``, the
``commands`` row (``delivered_at``, ``accepted_at``, ``finished_at``: Postgres ``now()``,
i.e. the start of the transaction that set them) and endpointd's journal (``received_at``,
``started_at``, ``finished_at`` and the ``duration`` of the Finished it sent); all clocks are
this machine's. And CPU per command of the gateway, endpointd (its supervisors included),
Postgres and this process; plus the cost of one ``python -m endpointd.process.supervisor`` run of
``true`` alone. ``--profile DIR`` records py-spy profiles (raw collapsed stacks) of the
gateway and of endpointd during the sequential phase and prints their hottest frames.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import json
import math
import os
import platform
import pwd
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO

import grpc
import psutil

REPO = Path(__file__).resolve().parent.parent
ECHO_METHOD = "/bench.Echo/Ping"
PING = b"ping-0123456789ab"  # 17 bytes
GOAL_P50_MS = 5.0


# -- statistics ------------------------------------------------------------------------


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


@dataclasses.dataclass
class System:
    """One thing measured: how to do one round trip, and what was measured so far."""

    name: str
    trip: Callable[[], Awaitable[float]]  # one round trip; returns its latency in seconds
    cpu: CpuMeter
    # The concurrent phase's round trip, when it differs (e.g. keeps no timestamps).
    concurrent_trip: Callable[[], Awaitable[float]] | None = None
    latencies: list[float] = dataclasses.field(default_factory=list)  # sequential phase
    ops: int = 0  # round trips in the concurrent phase
    seconds: float = 0.0  # wall time of the concurrent phase

    @property
    def p50_ms(self) -> float:
        return percentile(self.latencies, 0.50) * 1000

    @property
    def p99_ms(self) -> float:
        return percentile(self.latencies, 0.99) * 1000

    @property
    def ops_per_second(self) -> float:
        return self.ops / self.seconds if self.seconds else 0.0

    async def sequential(self, count: int) -> None:
        for _ in range(count):
            self.latencies.append(await self.trip())

    async def concurrent(self, count: int, concurrency: int) -> None:
        """``count`` round trips by ``concurrency`` workers, with the CPU they cost."""
        remaining = count
        trip = self.concurrent_trip or self.trip

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                await trip()

        self.cpu.start()
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        self.seconds += time.perf_counter() - started
        self.cpu.stop()
        self.ops += count


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


# -- the machine -----------------------------------------------------------------------


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def openssh_version() -> str:
    with contextlib.suppress(OSError):
        out = subprocess.run(["ssh", "-V"], capture_output=True, text=True, check=False)
        return (out.stderr or out.stdout).strip()
    return "not installed"


def machine_summary(postgres_version: str) -> list[tuple[str, str]]:
    return [
        ("date (UTC)", f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M}"),
        ("CPU", f"nproc {len(os.sched_getaffinity(0))} × {cpu_model()}"),
        ("RAM", f"{psutil.virtual_memory().total / 2**30:.1f} GiB"),
        ("kernel", platform.release()),
        ("Python", platform.python_version()),
        ("grpcio", grpc.__version__),
        ("Postgres", postgres_version),
        ("OpenSSH", openssh_version()),
        ("load average at start", " ".join(f"{x:.2f}" for x in os.getloadavg())),
    ]


def open_log(path: Path) -> BinaryIO:
    return open(path, "ab")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        assert isinstance(port, int)
        return port


async def wait_for_port(port: int, process: asyncio.subprocess.Process, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if process.returncode is not None:
            raise RuntimeError(f"process {process.pid} exited with {process.returncode}")
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            await writer.wait_closed()
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing listens on port {port} after {timeout} s")
        await asyncio.sleep(0.1)


async def stop_process(process: asyncio.subprocess.Process, timeout: float = 10) -> None:
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()


# -- CPU accounting --------------------------------------------------------------------


def process_cpu(pid: int | None, *, tree: bool) -> float:
    """CPU seconds of ``pid`` and its reaped children; with ``tree``, of live ones too."""
    if pid is None:
        return 0.0
    try:
        proc = psutil.Process(pid)
        times = proc.cpu_times()
        total = times.user + times.system + times.children_user + times.children_system
        children = proc.children(recursive=True) if tree else []
    except psutil.Error:
        return 0.0
    for child in children:  # backends, supervisors and sshd sessions come and go
        with contextlib.suppress(psutil.Error):
            t = child.cpu_times()  # children_*: what it reaped (a session's shell)
            total += t.user + t.system + t.children_user + t.children_system
    return total


@dataclasses.dataclass
class CpuMeter:
    """CPU seconds used by each party (pid, whole tree?) between ``start()`` and ``stop()``."""

    parties: dict[str, tuple[int | None, bool]]
    before: dict[str, float] = dataclasses.field(default_factory=dict)
    used: dict[str, float] = dataclasses.field(default_factory=dict)

    def _now(self) -> dict[str, float]:
        return {name: process_cpu(pid, tree=tree) for name, (pid, tree) in self.parties.items()}

    def start(self) -> None:
        self.before = self._now()

    def stop(self) -> None:
        for name, seconds in self._now().items():
            self.used[name] = self.used.get(name, 0.0) + seconds - self.before[name]


# -- Postgres, the gateway, endpointd --------------------------------------------------


@dataclasses.dataclass
class Stack:
    root: Path
    database_url: str
    gateway: asyncio.subprocess.Process
    grpc_port: int
    ca_pem: bytes
    fingerprint: str
    postmaster_pid: int | None


@contextlib.asynccontextmanager
async def superagent_stack(root: Path) -> AsyncIterator[Stack]:
    from controlplane.db import migrate
    from controlplane.db.embedded import EmbeddedPostgres
    from controlplane.gateway.tls import ensure_server_tls

    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    embedded = EmbeddedPostgres(root)
    url = await asyncio.to_thread(embedded.start)
    try:
        await migrate.upgrade(url)
        state = root / "gateway"
        # The gateway loads the CA and certificate created here (it only creates missing
        # ones), so this is the fingerprint the device pins.
        tls = ensure_server_tls(state / "tls")
        grpc_port, http_port = free_port(), free_port()
        env = {
            **os.environ,
            "DATABASE_URL": url,
            "SUPERAGENT_STATE_DIR": str(state),
            "SUPERAGENT_GRPC__PORT": str(grpc_port),
            "SUPERAGENT_HTTP__PORT": str(http_port),
        }
        with open_log(root / "gateway.log") as log:
            gateway = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "controlplane.cli",
                "serve",
                env=env,
                cwd=root,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            await wait_for_port(grpc_port, gateway, 60)
            pg_pid = await postmaster_pid(url)
            yield Stack(root, url, gateway, grpc_port, tls.ca_pem, tls.fingerprint, pg_pid)
        finally:
            await stop_process(gateway)
    finally:
        await asyncio.to_thread(embedded.stop)


async def postmaster_pid(url: str) -> int | None:
    import asyncpg

    from controlplane.db.urls import asyncpg_dsn

    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:  # while the backend still exists
        backend = await conn.fetchval("SELECT pg_backend_pid()")
        with contextlib.suppress(psutil.Error):
            parent = psutil.Process(int(backend)).parent()
            return parent.pid if parent is not None else None
        return None
    finally:
        await conn.close()


async def postgres_version(url: str) -> str:
    import asyncpg

    from controlplane.db.urls import asyncpg_dsn

    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        return str(await conn.fetchval("SHOW server_version"))
    finally:
        await conn.close()


async def new_pairing_code(url: str, name: str) -> str:
    import asyncpg

    from controlplane.db.urls import asyncpg_dsn
    from controlplane.gateway import pairing

    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        issued = await pairing.create_code(
            conn, device_name=name, owner="bench", created_by="bench.roundtrip"
        )
        return issued.display
    finally:
        await conn.close()


@dataclasses.dataclass
class Endpointd:
    home: Path
    process: asyncio.subprocess.Process | None = None

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "ENDPOINTD_CONFIG_DIR": str(self.home / "config"),
            "ENDPOINTD_STATE_DIR": str(self.home / "state"),
            "ENDPOINTD_DATA_DIR": str(self.home / "data"),
            "PYTHON_KEYRING_BACKEND": "keyring.backends.fail.Keyring",
        }

    @property
    def work(self) -> Path:
        """The allowed root, where commands run; endpointd's own files are beside it."""
        return self.home / "work"

    @property
    def journal(self) -> Path:
        return self.home / "state" / "journal.sqlite3"

    async def pair(self, url: str, code: str, fingerprint: str) -> str:
        """``endpointd pair``; a subprocess, so this loop stays free. Returns the device id."""
        self.home.mkdir(parents=True, exist_ok=True)
        self.work.mkdir(exist_ok=True)
        # Outside the repository root: there `python -m endpointd` would import the
        # distribution folder instead of the package.
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "endpointd",
            "pair",
            url,
            code,
            "--key-file",
            str(self.home / "device.key"),
            "--fingerprint",
            fingerprint,
            "--allow-root",
            str(self.work),
            env=self.env,
            cwd=self.home,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        out, _ = await proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"endpointd pair failed: {out.decode(errors='replace')}")
        config = json.loads((self.home / "config" / "config.json").read_text())
        device_id = config["device_id"]
        assert isinstance(device_id, str)
        return device_id

    def add_policy(self, text: str) -> None:
        """Append ``text`` (whole tables) to the paired device's policy."""
        policy = self.home / "config" / "policy.toml"
        policy.write_text(policy.read_text() + "\n" + text)
        policy.chmod(0o600)

    def set_sandbox(self, mode: str) -> None:
        """Put ``sandbox = MODE`` at the top of the paired device's policy (where top-level
        keys must be), replacing any such line."""
        policy = self.home / "config" / "policy.toml"
        lines = [
            line for line in policy.read_text().splitlines() if not line.startswith("sandbox =")
        ]
        policy.write_text("\n".join([f"sandbox = {json.dumps(mode)}", *lines]) + "\n")
        policy.chmod(0o600)

    async def start(self, monitor_interval: float | None = None) -> None:
        launcher = ["-m", "endpointd"]
        if monitor_interval is not None:
            # A what-if experiment, not endpointd as shipped: its exit-polling interval.
            launcher = [
                "-c",
                "import endpointd.commands.daemon, endpointd.cli; "
                f"endpointd.commands.daemon.MONITOR_INTERVAL = {monitor_interval!r}; "
                "endpointd.cli.main()",
            ]
        with open_log(self.home / "endpointd.log") as log:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable,
                *launcher,
                "run",
                env=self.env,
                cwd=self.home,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    async def stop(self) -> None:
        if self.process is not None:
            await stop_process(self.process)


async def wait_connected(pool: Any, device_id: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not await pool.fetchval(
        "SELECT connected_replica IS NOT NULL FROM devices WHERE id = $1", device_id
    ):
        if time.monotonic() > deadline:
            raise TimeoutError(f"device {device_id} did not connect within {timeout} s")
        await asyncio.sleep(0.1)


# -- a device that answers at once ------------------------------------------------------


class InstantDevice:
    """Speaks the device protocol; answers every Command with Accepted then Finished(0)."""

    def __init__(self, target: str, ca_pem: bytes) -> None:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        self.target = target
        self.ca_pem = ca_pem
        self.key = Ed25519PrivateKey.generate()
        self.device_id = ""
        self._channel: Any = None
        self._call: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._write_lock = asyncio.Lock()
        self.received: dict[str, float] = {}  # command id → wall clock when it arrived

    def _new_channel(self) -> Any:
        from controlplane.gateway.tls import GATEWAY_NAME

        credentials = grpc.ssl_channel_credentials(root_certificates=self.ca_pem)
        return grpc.aio.secure_channel(
            self.target, credentials, options=[("grpc.ssl_target_name_override", GATEWAY_NAME)]
        )

    @property
    def public_key(self) -> bytes:
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        return self.key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    async def pair(self, code: str) -> None:
        from superagent_proto.v1 import endpoint_pb2 as pb
        from superagent_proto.v1 import endpoint_pb2_grpc

        async with self._new_channel() as channel:
            stub = endpoint_pb2_grpc.EndpointGatewayStub(channel)
            response = await stub.Pair(
                pb.PairRequest(
                    pairing_code=code,
                    device_name="instant",
                    public_key=self.public_key,
                    daemon_version="bench",
                    protocol_version=1,
                )
            )
        self.device_id = response.device_id

    async def connect(self) -> None:
        from superagent_proto.v1 import endpoint_pb2 as pb
        from superagent_proto.v1 import endpoint_pb2_grpc
        from superagent_shared.protocol import hello_signing_payload

        self._channel = self._new_channel()
        self._call = endpoint_pb2_grpc.EndpointGatewayStub(self._channel).Connect()
        challenge = await self._call.read()
        policy_hash = b"\0" * 32
        signature = self.key.sign(
            hello_signing_payload(
                nonce=challenge.challenge.nonce,
                device_id=self.device_id,
                daemon_version="bench",
                protocol_version=1,
                policy_hash=policy_hash,
            )
        )
        await self._call.write(
            pb.DeviceMessage(
                hello=pb.Hello(
                    device_id=self.device_id,
                    daemon_version="bench",
                    protocol_version=1,
                    signature=signature,
                    policy_hash=policy_hash,
                )
            )
        )
        self._tasks = [
            asyncio.create_task(self._answer()),
            asyncio.create_task(self._heartbeats()),
        ]

    async def _write(self, message: Any) -> None:
        async with self._write_lock:
            await self._call.write(message)

    async def _answer(self) -> None:
        from superagent_proto.v1 import endpoint_pb2 as pb

        while (message := await self._call.read()) is not grpc.aio.EOF:
            if message.WhichOneof("msg") != "command":
                continue
            command_id = message.command.command_id
            self.received.setdefault(command_id, time.time())
            await self._write(pb.DeviceMessage(accepted=pb.Accepted(command_id=command_id)))
            await self._write(
                pb.DeviceMessage(
                    finished=pb.Finished(command_id=command_id, exit_code=0, total_output_bytes=0)
                )
            )

    async def _heartbeats(self) -> None:
        from superagent_proto.v1 import endpoint_pb2 as pb

        seq = 0
        while True:
            await asyncio.sleep(10)
            seq += 1
            await self._write(pb.DeviceMessage(heartbeat=pb.Heartbeat(seq=seq)))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._call is not None:
            self._call.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        if self._channel is not None:
            await self._channel.close()


# -- the superagent round trip ---------------------------------------------------------


@dataclasses.dataclass
class Trip:
    command_id: str
    begin: float  # wall clock, before submit
    submitted: float  # wall clock, submit returned (committed)
    done: float  # wall clock, wait returned the final result
    latency: float  # perf_counter difference


async def one_trip(queue: Any, device_id: str) -> Trip:
    from controlplane.gateway import specs

    begin, start = time.time(), time.perf_counter()
    command_id = await queue.submit(device_id, specs.Exec(["true"]), origin="bench.roundtrip")
    submitted = time.time()
    result = await queue.wait(command_id, timeout=60)
    latency = time.perf_counter() - start
    if not result.ok:
        raise RuntimeError(f"{command_id} ended {result.state} exit {result.exit_code}")
    return Trip(command_id, begin, submitted, time.time(), latency)


async def command_rows(pool: Any, ids: list[str]) -> dict[str, dict[str, float | None]]:
    """Postgres' timestamps of each command, as Unix times."""
    rows = await pool.fetch(
        """
        SELECT id, extract(epoch FROM created_at)::float8 AS created,
               extract(epoch FROM delivered_at)::float8 AS delivered,
               extract(epoch FROM accepted_at)::float8 AS accepted,
               extract(epoch FROM finished_at)::float8 AS finished
        FROM commands WHERE id = ANY($1::text[])
        """,
        ids,
    )
    return {row["id"]: dict(row) for row in rows}


def journal_rows(path: Path, ids: list[str]) -> dict[str, dict[str, float | None]]:
    from superagent_proto.v1 import endpoint_pb2 as pb

    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT command_id, received_at, started_at, finished_at, result FROM commands"
        ).fetchall()
    finally:
        conn.close()
    wanted = set(ids)
    out: dict[str, dict[str, float | None]] = {}
    for command_id, received, started, finished, result in rows:
        if command_id not in wanted:
            continue
        duration = None
        if result is not None:
            message = pb.DeviceMessage.FromString(result)
            duration = message.finished.duration.ToNanoseconds() / 1e9
        out[command_id] = {
            "received": received,
            "started": started,
            "finished": finished,
            "duration": duration,
        }
    return out


Event = tuple[str, Callable[[Trip], float | None]]


def timeline(trips: list[Trip], events: list[Event]) -> str:
    """For each event, when it happened after the worker called submit() (p50, mean)."""
    rows: list[list[object]] = []
    previous = 0.0
    for label, when in events:
        offsets = []
        for trip in trips:
            at = when(trip)
            if at is not None:
                offsets.append((at - trip.begin) * 1000)
        if not offsets:
            rows.append([label, "n/a", "n/a", ""])
            continue
        p50 = statistics.median(offsets)
        rows.append(
            [label, f"{p50:.2f}", f"{statistics.fmean(offsets):.2f}", f"{p50 - previous:+.2f}"]
        )
        previous = p50
    return markdown_table(["event", "p50 ms after submit()", "mean ms", "Δ p50"], rows)


Row = dict[str, float | None]


def endpointd_timeline(trips: list[Trip], db: dict[str, Row], journal: dict[str, Row]) -> str:
    def pg(column: str) -> Callable[[Trip], float | None]:
        return lambda trip: db.get(trip.command_id, {}).get(column)

    def device(column: str) -> Callable[[Trip], float | None]:
        return lambda trip: journal.get(trip.command_id, {}).get(column)

    events: list[Event] = [
        ("submit txn begins (`created_at`)", pg("created")),
        ("submit() returned to the worker (committed, NOTIFY sent)", lambda t: t.submitted),
        ("gateway: `mark_delivered` txn (Command handed to the stream)", pg("delivered")),
        (
            "endpointd: Command received (journal `received_at`, before its fsync)",
            device("received"),
        ),
        ("gateway: `mark_accepted` txn (Accepted read)", pg("accepted")),
        (
            # Equal to received_at when the command was next in line (journaled running
            # in the same commit).
            "endpointd: journaled running (`started_at`, before the spare gets it)",
            device("started"),
        ),
        (
            "endpointd: outcome read (journal `finished_at`, the supervisor's done signal)",
            device("finished"),
        ),
        ("gateway: `finish()` txn begins (Finished read)", pg("finished")),
        ("wait() returned the final result", lambda t: t.done),
    ]
    children = [
        duration * 1000 for row in journal.values() if (duration := row.get("duration")) is not None
    ]
    note = ""
    if children:
        note = (
            f"\n\n`true` itself, as timed by the supervisor (Finished.duration): p50 "
            f"{statistics.median(children):.2f} ms."
        )
    return timeline(trips, events) + note


def instant_timeline(trips: list[Trip], db: dict[str, Row], received: dict[str, float]) -> str:
    def pg(column: str) -> Callable[[Trip], float | None]:
        return lambda trip: db.get(trip.command_id, {}).get(column)

    events: list[Event] = [
        ("submit txn begins (`created_at`)", pg("created")),
        ("submit() returned to the worker (committed, NOTIFY sent)", lambda t: t.submitted),
        ("gateway: `mark_delivered` txn (Command handed to the stream)", pg("delivered")),
        (
            "device: Command received (answers Accepted + Finished at once)",
            lambda t: received.get(t.command_id),
        ),
        ("gateway: `mark_accepted` txn (Accepted read)", pg("accepted")),
        ("gateway: `finish()` txn begins (Finished read)", pg("finished")),
        ("wait() returned the final result", lambda t: t.done),
    ]
    return timeline(trips, events)


# -- py-spy ----------------------------------------------------------------------------


def find_py_spy() -> str | None:
    candidate = Path(sys.executable).parent / "py-spy"
    return str(candidate) if candidate.exists() else shutil.which("py-spy")


@contextlib.asynccontextmanager
async def profiled(directory: Path | None, targets: dict[str, int]) -> AsyncIterator[None]:
    """py-spy ``record --format raw`` of each target while the block runs."""
    py_spy = find_py_spy()
    if directory is None or py_spy is None:
        if directory is not None:
            print("py-spy not found (pip install py-spy); not profiling", flush=True)
        yield
        return
    await asyncio.to_thread(directory.mkdir, parents=True, exist_ok=True)
    spies = []
    for name, pid in targets.items():
        spies.append(
            await asyncio.create_subprocess_exec(
                py_spy,
                "record",
                "--pid",
                str(pid),
                "--rate",
                "250",
                "--format",
                "raw",
                "--subprocesses",
                "--output",
                str(directory / f"{name}.txt"),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    await asyncio.sleep(1.0)  # py-spy attaches
    try:
        yield
    finally:
        for spy in spies:
            with contextlib.suppress(ProcessLookupError):
                spy.send_signal(signal.SIGINT)
        for spy in spies:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(spy.wait(), 30)
        for name in targets:
            path = directory / f"{name}.txt"
            if path.exists():
                print(f"\npy-spy {name} ({path}):\n{summarize_profile(path)}", flush=True)


def summarize_profile(path: Path, top: int = 12) -> str:
    """The hottest frames of a raw py-spy profile: own samples and inclusive samples."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = stack.split(";")
        own[frames[-1]] += count
        for frame in set(frames[1:]):  # the first frame is the process/thread
            inclusive[frame] += count
    if not total:
        return "(no samples)"
    lines = [f"{total} samples; own:"]
    lines += [f"  {n * 100 / total:5.1f}%  {frame}" for frame, n in own.most_common(top)]
    lines.append("inclusive:")
    lines += [f"  {n * 100 / total:5.1f}%  {frame}" for frame, n in inclusive.most_common(top)]
    return "\n".join(lines)


# -- device-side fixed costs -----------------------------------------------------------


def time_supervisor(root: Path, runs: int, supervised: list[float], bare: list[float]) -> None:
    """Wall time of the supervisor (``-m endpointd.process.supervisor``) running ``true``."""
    spec = json.dumps(
        {
            "argv": ["true"],
            "cwd": str(root),
            "env": dict(os.environ),
            "timeout_seconds": 3600,
            "kill_grace_seconds": 10,
            "stdin": False,
        }
    ).encode()
    for _ in range(runs):
        spool = root / "supervise" / str(len(supervised))
        spool.mkdir(parents=True)
        start = time.perf_counter()
        # As endpointd starts it (executor.start_exec): spec on stdin, cwd = the spool.
        subprocess.run(
            [sys.executable, "-m", "endpointd.process.supervisor", str(spool)],
            input=spec,
            cwd=spool,
            check=True,
            stderr=subprocess.DEVNULL,
        )
        supervised.append(time.perf_counter() - start)
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], cwd=root, check=True)
        bare.append(time.perf_counter() - start)


# -- ssh -------------------------------------------------------------------------------

SSHD = Path("/usr/sbin/sshd")


def ensure_sshd(install: bool) -> bool:
    if SSHD.exists():
        return True
    if not install or os.geteuid() != 0 or shutil.which("apt-get") is None:
        return False
    print("installing openssh-server (apt-get install -y openssh-server)", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    done = subprocess.run(["apt-get", "install", "-y", "openssh-server"], env=env, check=False)
    if done.returncode != 0:
        subprocess.run(["apt-get", "update"], env=env, check=False)
        subprocess.run(["apt-get", "install", "-y", "openssh-server"], env=env, check=False)
    return SSHD.exists()


@contextlib.contextmanager
def temporary_user() -> Iterator[str | None]:
    """A throwaway account whose shell is ``/bin/sh`` (no rc files), removed afterwards."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        yield None
        return
    name = f"sabench{os.getpid()}"
    home = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    # "*": no password, but not locked (sshd with UsePAM no refuses a "!" account).
    command = ["useradd", "--no-create-home", "--home-dir", str(home), "--shell", "/bin/sh"]
    created = subprocess.run([*command, "--password", "*", name], check=False)
    if created.returncode == 0:
        entry = pwd.getpwnam(name)
        os.chown(home, entry.pw_uid, entry.pw_gid)
    try:
        yield name if created.returncode == 0 else None
    finally:
        shutil.rmtree(home, ignore_errors=True)
        if created.returncode == 0:
            subprocess.run(["userdel", name], check=False, capture_output=True)


@contextlib.contextmanager
def ssh_masters(directory: Path, users: Sequence[str]) -> Iterator[dict[str, list[str]]]:
    """A private sshd and one ControlMaster per user; yields each user's muxed ``ssh … true``."""
    directory.mkdir(parents=True)
    host_key, user_key = directory / "host_ed25519", directory / "id_ed25519"
    for key in (host_key, user_key):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    authorized = directory / "authorized_keys"
    authorized.write_text((directory / "id_ed25519.pub").read_text())
    authorized.chmod(0o644)  # read as the user being logged in, too
    port = free_port()
    config = directory / "sshd_config"
    config.write_text(
        f"""\
Port {port}
ListenAddress 127.0.0.1
HostKey {host_key}
PidFile {directory / "sshd.pid"}
AuthorizedKeysFile {authorized}
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
PrintLastLog no
MaxSessions 100
MaxStartups 100
LogLevel ERROR
"""
    )
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
    with open_log(directory / "sshd.log") as log:
        sshd = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(config)], stderr=log)

    def base(user: str) -> list[str]:
        return [
            "ssh",
            "-F",
            "/dev/null",
            "-p",
            str(port),
            "-i",
            str(user_key),
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "LogLevel=ERROR",
            "-o",
            f"UserKnownHostsFile={directory / 'known_hosts'}",
            "-o",
            f"ControlPath={directory / ('cm-' + user)}",
        ]

    try:
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            if time.monotonic() > deadline or sshd.poll() is not None:
                raise RuntimeError(f"sshd did not start; see {directory / 'sshd.log'}")
            time.sleep(0.05)
        commands: dict[str, list[str]] = {}
        for user in users:
            target = f"{user}@127.0.0.1"
            master = [*base(user), "-o", "ControlMaster=yes", "-o", "ControlPersist=60"]
            try:
                subprocess.run([*master, target, "true"], check=True, timeout=30)
                check = [*base(user), "-O", "check", target]
                subprocess.run(check, check=True, timeout=10, capture_output=True)
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
                # One reference lost (sshd refused this user here) is no reason to lose the
                # whole run: its rows say n/a.
                print(f"ssh as {user} is left out: {exc}", file=sys.stderr)
                continue
            commands[user] = [*base(user), target, "true"]
        yield commands
    finally:
        for user in users:
            with contextlib.suppress(Exception):
                subprocess.run(
                    [*base(user), "-O", "exit", f"{user}@127.0.0.1"],
                    capture_output=True,
                    timeout=10,
                )
        sshd.terminate()
        try:
            sshd.wait(10)
        except subprocess.TimeoutExpired:
            sshd.kill()
            sshd.wait()


def ssh_trip(command: list[str], executor: ThreadPoolExecutor) -> Callable[[], Awaitable[float]]:
    """One ``ssh … true`` (a new process, as from a shell), on a thread of ``executor``."""

    def run_once() -> float:
        start = time.perf_counter()
        subprocess.run(command, check=True, stdin=subprocess.DEVNULL, timeout=30)
        return time.perf_counter() - start

    async def trip() -> float:
        return await asyncio.get_running_loop().run_in_executor(executor, run_once)

    return trip


# -- bare gRPC ping-pong ---------------------------------------------------------------


async def echo_server() -> None:
    """``--echo-server``: serve the generic echo stream; print the port; run until killed."""

    async def echo(requests: AsyncIterator[bytes], _context: Any) -> AsyncIterator[bytes]:
        async for message in requests:
            yield message

    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler(
        "bench.Echo",
        {
            "Ping": grpc.stream_stream_rpc_method_handler(
                echo, request_deserializer=None, response_serializer=None
            )
        },
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(1)


@dataclasses.dataclass
class Echo:
    pid: int
    trip: Callable[[], Awaitable[float]]


@contextlib.asynccontextmanager
async def echo_client(concurrency: int) -> AsyncIterator[Echo]:
    """The echo server in its own process, and ``concurrency`` open streams to it."""
    server = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.roundtrip",
        "--echo-server",
        cwd=REPO,
        stdout=subprocess.PIPE,
    )
    try:
        assert server.stdout is not None
        port = int((await asyncio.wait_for(server.stdout.readline(), 60)).decode())
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            method = channel.stream_stream(
                ECHO_METHOD, request_serializer=None, response_deserializer=None
            )
            calls = [method() for _ in range(concurrency)]
            idle = list(calls)

            async def trip() -> float:
                call = idle.pop()  # one round trip at a time per stream
                try:
                    start = time.perf_counter()
                    await call.write(PING)
                    reply = await call.read()
                    elapsed = time.perf_counter() - start
                    assert reply == PING
                    return elapsed
                finally:
                    idle.append(call)

            yield Echo(server.pid, trip)
            for call in calls:
                await call.done_writing()
    finally:
        await stop_process(server)


# -- the run ---------------------------------------------------------------------------


def summary_rows(systems: list[System], ssh: System | None) -> list[list[object]]:
    rows: list[list[object]] = []
    for system in systems:
        if ssh is None:
            p50_ratio = ops_ratio = "n/a"
        else:
            p50_ratio = f"{system.p50_ms / ssh.p50_ms:.2f}×"
            ops_ratio = f"{system.ops_per_second / ssh.ops_per_second:.2f}×"
        rows.append(
            [
                system.name,
                f"{system.p50_ms:.2f}",
                f"{system.p99_ms:.2f}",
                f"{system.ops_per_second:.0f}",
                p50_ratio,
                ops_ratio,
            ]
        )
    return rows


def cpu_rows(systems: list[System]) -> list[list[object]]:
    rows: list[list[object]] = []
    for system in systems:
        if not system.ops:
            continue
        per_op = {party: seconds * 1000 / system.ops for party, seconds in system.cpu.used.items()}
        parts = ", ".join(f"{party} {ms:.2f}" for party, ms in per_op.items())
        rows.append([system.name, f"{sum(per_op.values()):.2f}", parts])
    return rows


def superagent_trip(
    queue: Any, device_id: str, record: list[Trip]
) -> tuple[Callable[[], Awaitable[float]], Callable[[], Awaitable[float]]]:
    """(a sequential round trip that keeps its timestamps, a concurrent one that does not)."""

    async def recorded() -> float:
        trip = await one_trip(queue, device_id)
        record.append(trip)
        return trip.latency

    async def plain() -> float:
        return (await one_trip(queue, device_id)).latency

    return recorded, plain


async def run(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-rt-"))
    try:
        async with contextlib.AsyncExitStack() as resources:
            await measure_all(args, root, resources)
    finally:
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


async def measure_all(
    args: argparse.Namespace, root: Path, resources: contextlib.AsyncExitStack
) -> None:
    from controlplane.db.urls import asyncpg_dsn
    from controlplane.effects.runner import create_pool
    from controlplane.gateway.queue import CommandQueue

    stack = await resources.enter_async_context(superagent_stack(root))
    version = await postgres_version(stack.database_url)
    for key, value in machine_summary(version):
        print(f"- {key}: {value}", flush=True)
    print(f"- command: python -m bench.roundtrip {' '.join(sys.argv[1:])}", flush=True)
    if args.what_if_monitor_interval is not None:
        print(
            f"- WHAT-IF: endpointd's MONITOR_INTERVAL = {args.what_if_monitor_interval} s "
            "(patched at start; not endpointd as shipped)",
            flush=True,
        )

    # wait() holds a connection for its LISTEN while it waits and takes another one for
    # each re-read, so a worker needs two per concurrent round trip.
    pool = await create_pool(asyncpg_dsn(stack.database_url), size=2 * args.concurrency + 4)
    resources.push_async_callback(pool.close)
    queue = CommandQueue(pool)

    daemon = Endpointd(root / "endpointd")
    code = await new_pairing_code(stack.database_url, "bench-endpointd")
    daemon_id = await daemon.pair(f"https://127.0.0.1:{stack.grpc_port}", code, stack.fingerprint)
    await daemon.start(args.what_if_monitor_interval)
    resources.push_async_callback(daemon.stop)
    await wait_connected(pool, daemon_id)
    assert daemon.process is not None
    if args.workspaces_only:
        await measure_workspaces(args, root, daemon, daemon_id, queue)
        return

    # The same daemon with the sandbox off: what confining each command costs.
    unconfined = Endpointd(root / "endpointd-unconfined")
    code = await new_pairing_code(stack.database_url, "bench-unconfined")
    unconfined_id = await unconfined.pair(
        f"https://127.0.0.1:{stack.grpc_port}", code, stack.fingerprint
    )
    unconfined.set_sandbox("off")
    await unconfined.start(args.what_if_monitor_interval)
    resources.push_async_callback(unconfined.stop)
    await wait_connected(pool, unconfined_id)
    assert unconfined.process is not None

    device = InstantDevice(f"127.0.0.1:{stack.grpc_port}", stack.ca_pem)
    await device.pair(await new_pairing_code(stack.database_url, "bench-instant"))
    await device.connect()
    resources.push_async_callback(device.close)
    await wait_connected(pool, device.device_id)

    me = os.getpid()
    gateway = (stack.gateway.pid, False)
    postgres = (stack.postmaster_pid, True)
    real_trips: list[Trip] = []
    instant_trips: list[Trip] = []
    real_seq, real_par = superagent_trip(queue, daemon_id, real_trips)
    instant_seq, instant_par = superagent_trip(queue, device.device_id, instant_trips)
    off_trips: list[Trip] = []
    off_seq, off_par = superagent_trip(queue, unconfined_id, off_trips)
    real = System(
        "superagent gateway + endpointd (exec `true`, sandbox required: as shipped)",
        real_seq,
        CpuMeter(
            {
                "gateway": gateway,
                "endpointd + supervisors": (daemon.process.pid, True),
                "postgres": postgres,
                "worker": (me, False),
            }
        ),
    )
    instant = System(
        "superagent gateway + instant device (no exec)",
        instant_seq,
        CpuMeter({"gateway": gateway, "postgres": postgres, "worker + device": (me, False)}),
    )
    off = System(
        "superagent gateway + endpointd (exec `true`, sandbox off)",
        off_seq,
        CpuMeter(
            {
                "gateway": gateway,
                "endpointd + supervisors": (unconfined.process.pid, True),
                "postgres": postgres,
                "worker": (me, False),
            }
        ),
    )
    real.concurrent_trip = real_par
    off.concurrent_trip = off_par
    instant.concurrent_trip = instant_par
    systems = [real, off, instant]

    ssh_reference: System | None = None
    if await asyncio.to_thread(ensure_sshd, not args.no_install):
        clean_user = resources.enter_context(temporary_user())
        users = ["root"] + ([clean_user] if clean_user else [])
        commands = resources.enter_context(ssh_masters(root / "ssh", users))
        executor = resources.enter_context(ThreadPoolExecutor(args.concurrency))
        sshd_pid = int((root / "ssh" / "sshd.pid").read_text())
        for user in [u for u in users if u in commands]:
            name = (
                "ssh, reused master, as root (bash + this machine's ~/.bashrc)"
                if user == "root"
                else "ssh, reused master, user with /bin/sh (no rc files)"
            )
            ssh = System(
                name,
                ssh_trip(commands[user], executor),
                CpuMeter({"sshd": (sshd_pid, True), "ssh clients + worker": (me, False)}),
            )
            systems.append(ssh)
            ssh_reference = ssh  # the last one: the /bin/sh user when there is one
    else:
        print("no /usr/sbin/sshd: the ssh comparison is skipped", flush=True)

    echo = await resources.enter_async_context(echo_client(args.concurrency))
    systems.append(
        System(
            "bare grpc.aio bidi ping-pong (floor)",
            echo.trip,
            CpuMeter({"server": (echo.pid, False), "client": (me, False)}),
        )
    )

    print("\nwarming up …", flush=True)
    for system in systems:
        await system.sequential(args.warmup)
        system.latencies.clear()
    real_trips.clear()
    off_trips.clear()
    instant_trips.clear()

    # Interleaved rounds: on a busy machine, drift hits every system alike.
    rounds = max(1, args.rounds)
    per_round = [args.n // rounds + (1 if r < args.n % rounds else 0) for r in range(rounds)]
    supervisor_runs = [
        args.supervisor_runs // rounds + (1 if r < args.supervisor_runs % rounds else 0)
        for r in range(rounds)
    ]
    supervised: list[float] = []
    bare: list[float] = []
    profile_targets = {"gateway": stack.gateway.pid, "endpointd": daemon.process.pid}
    async with profiled(args.profile, profile_targets):
        for index, count in enumerate(per_round):
            order = systems[index % len(systems) :] + systems[: index % len(systems)]
            print(f"round {index + 1}/{rounds}: {count} round trips per system", flush=True)
            for system in order:
                await system.sequential(count)
            for system in order:
                await system.concurrent(count, args.concurrency)
            await asyncio.to_thread(time_supervisor, root, supervisor_runs[index], supervised, bare)

    print(f"- load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(
        "\n"
        + markdown_table(
            [
                "system",
                "p50 ms",
                "p99 ms",
                f"ops/s (C={args.concurrency})",
                "p50 ÷ ssh p50",
                "ops/s ÷ ssh ops/s",
            ],
            summary_rows(systems, ssh_reference),
        )
    )
    verdict = "met" if real.p50_ms <= GOAL_P50_MS else "NOT met"
    faster = "n/a" if ssh_reference is None else str(real.p50_ms < ssh_reference.p50_ms).lower()
    print(
        f"\nGoal p50 ≤ {GOAL_P50_MS:.0f} ms: {verdict} ({real.p50_ms:.2f} ms); "
        f"faster than ssh with a reused master (p50): {faster}.\n"
    )

    db = await command_rows(pool, [t.command_id for t in real_trips + instant_trips])
    journal = await asyncio.to_thread(
        journal_rows, daemon.journal, [t.command_id for t in real_trips]
    )
    print(
        "Where the time goes, gateway + endpointd (sequential round trips):\n\n"
        + endpointd_timeline(real_trips, db, journal)
        + "\n"
    )
    print(
        "Where the time goes, gateway + instant device (sequential round trips):\n\n"
        + instant_timeline(instant_trips, db, device.received)
        + "\n"
    )
    print(
        f"CPU ms per round trip in the concurrent phase (C={args.concurrency}), all processes "
        "involved:\n\n"
        + markdown_table(["system", "CPU ms / op", "by process"], cpu_rows(systems))
        + "\n"
    )
    if supervised:
        print(
            f"Device-side fixed cost per exec, measured alone ({len(supervised)} runs):\n\n"
            + markdown_table(
                ["process", "p50 ms", "p99 ms"],
                [
                    [
                        "`python -m endpointd.process.supervisor` running `true`",
                        f"{percentile(supervised, 0.5) * 1000:.2f}",
                        f"{percentile(supervised, 0.99) * 1000:.2f}",
                    ],
                    [
                        "`python -c pass` (same venv)",
                        f"{percentile(bare, 0.5) * 1000:.2f}",
                        f"{percentile(bare, 0.99) * 1000:.2f}",
                    ],
                ],
            )
            + "\n"
        )
    await measure_workspaces(args, root, daemon, daemon_id, queue)


# -- prepare_workspace against git worktree add ----------------------------------------

WORKSPACE_REMOTE = "https://github.com/bench/app.git"
WORKSPACE_REPO = "github.com/bench/app"
WORKSPACE_GOAL_RATIO = 1.2


def git_run(*args: str, cwd: Path) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "bench",
        "GIT_AUTHOR_EMAIL": "bench@example.com",
        "GIT_COMMITTER_NAME": "bench",
        "GIT_COMMITTER_EMAIL": "bench@example.com",
    }
    done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def make_repository(root: Path, clone: Path, files: int) -> str:
    """``clone`` with ``files`` files (100 directories, sizes 0.1-1 KB), pushed to a bare
    origin under ``root`` that the clone reaches through an https URL; its commit."""
    origin = root / "origin.git"
    git_run("init", "-q", "--bare", "-b", "main", str(origin), cwd=root)
    git_run("init", "-q", "-b", "main", str(clone), cwd=root)
    git_run("config", f"url.{origin.as_uri()}.insteadOf", WORKSPACE_REMOTE, cwd=clone)
    git_run("remote", "add", "origin", WORKSPACE_REMOTE, cwd=clone)
    for i in range(files):
        path = clone / f"pkg{i % 100:02d}" / f"mod{i % 7}" / f"file{i:05d}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# file {i}\n" + "x = 1\n" * (i % 150 + 10))
    git_run("add", "-A", cwd=clone)
    git_run("commit", "-qm", f"{files} files", cwd=clone)
    git_run("push", "-q", "origin", "main", cwd=clone)
    git_run("remote", "set-head", "origin", "main", cwd=clone)
    return git_run("rev-parse", "HEAD", cwd=clone)


async def measure_workspaces(
    args: argparse.Namespace, root: Path, daemon: Endpointd, device_id: str, queue: Any
) -> None:
    from controlplane.gateway import specs

    if args.workspaces <= 0:
        return
    clone = daemon.work / "app"
    print(f"\nprepare_workspace: a repository of {args.workspace_files} files …", flush=True)
    commit = await asyncio.to_thread(make_repository, root, clone, args.workspace_files)
    # Released workspaces go at once, so each round starts from the same disk.
    daemon.add_policy("[workspaces]\nretention_hours = 0\nmax_disk_mb = 1000000\n")
    plain_dir = root / "plain-worktrees"
    plain_dir.mkdir()
    serial = iter(range(1_000_000))

    async def by_hand() -> float:
        index = next(serial)
        target, branch = plain_dir / f"w{index}", f"bench/plain-{index}"
        started = time.perf_counter()
        await asyncio.to_thread(
            git_run, "worktree", "add", "-q", "-b", branch, str(target), commit, cwd=clone
        )
        took = time.perf_counter() - started
        await asyncio.to_thread(git_run, "worktree", "remove", "--force", str(target), cwd=clone)
        await asyncio.to_thread(git_run, "branch", "-D", branch, cwd=clone)
        return took

    async def prepared() -> float:
        ticket = f"tkt_bench{next(serial):06d}"
        spec = specs.PrepareWorkspace(
            ticket,
            repo=WORKSPACE_REPO,
            path=str(clone),
            base=specs.workspace_base("default_branch"),
            setup=False,
        )
        started = time.perf_counter()
        command_id = await queue.submit(device_id, spec)
        result = await queue.wait(command_id, timeout=300)
        took = time.perf_counter() - started
        if not result.ok:
            raise RuntimeError(f"prepare_workspace failed: {result}")
        released = await queue.submit(device_id, specs.ReleaseWorkspace(ticket))
        if not (await queue.wait(released, timeout=300)).ok:
            raise RuntimeError("release_workspace failed")
        return took

    hand: list[float] = []
    ours: list[float] = []
    for _ in range(2):  # warm-up: the page cache, the daemon's first scan
        await prepared()
        await by_hand()
    for index in range(args.workspaces):
        first, second = (prepared, by_hand) if index % 2 == 0 else (by_hand, prepared)
        for trip in (first, second):
            took = await trip()
            (ours if trip is prepared else hand).append(took)
    rows = []
    for name, values in (
        ("prepare_workspace through the gateway (fetch + worktree add + record)", ours),
        ("`git worktree add` of the same commit, by hand", hand),
    ):
        rows.append(
            [
                name,
                len(values),
                f"{percentile(values, 0.5) * 1000:.0f}",
                f"{percentile(values, 0.99) * 1000:.0f}",
                f"{statistics.mean(values) * 1000:.0f}",
            ]
        )
    print(f"- load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    ratio = percentile(ours, 0.5) / percentile(hand, 0.5)
    verdict = "met" if ratio <= WORKSPACE_GOAL_RATIO else "NOT met"
    print(
        f"\nprepare_workspace, {args.workspace_files} files:\n\n"
        + markdown_table(["", "runs", "p50 ms", "p99 ms", "mean ms"], rows)
        + f"\n\nGoal p50 ≤ {WORKSPACE_GOAL_RATIO}× git worktree add: {verdict} ({ratio:.2f}×)\n",
        flush=True,
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.roundtrip", description=__doc__)
    parser.add_argument("--n", type=int, default=300, help="round trips per phase")
    parser.add_argument("--concurrency", type=int, default=8, help="concurrent submitters")
    parser.add_argument("--warmup", type=int, default=10, help="untimed round trips first")
    parser.add_argument(
        "--rounds", type=int, default=5, help="interleaved rounds the n round trips are split in"
    )
    parser.add_argument(
        "--supervisor-runs", type=int, default=30, help="runs of the supervisor alone"
    )
    parser.add_argument("--profile", type=Path, help="py-spy raw profiles into this directory")
    parser.add_argument("--no-install", action="store_true", help="never apt-get openssh")
    parser.add_argument(
        "--what-if-monitor-interval",
        type=float,
        help="experiment: run endpointd with this exit-polling interval (shipped: 0.05 s)",
    )
    parser.add_argument(
        "--workspaces", type=int, default=10, help="prepare_workspace runs (0: skip them)"
    )
    parser.add_argument(
        "--workspace-files", type=int, default=10_000, help="files in its repository"
    )
    parser.add_argument(
        "--workspaces-only", action="store_true", help="measure prepare_workspace alone"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--echo-server", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.echo_server:
        asyncio.run(echo_server())
        return
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
