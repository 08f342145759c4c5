"""Idle fleet: memory per connected device and heartbeat CPU of one gateway replica.

Run by hand (never in CI)::

    python -m bench.gateway_fleet [--devices 5000] [--heartbeat-seconds 15[,5...]]
                                  [--cpu-seconds 60] [--tls on|off|both]
                                  [--servers gateway,baseline] [--database-url URL]

For each heartbeat interval, two servers are measured one after the other in the same run,
each in its own process (``python -m bench.simdevice serve ...``):

* ``gateway``: one real replica (DeviceHub + GatewayService, TLS, on a migrated Postgres);
* ``baseline``: a bare ``grpc.aio`` server with the same options and certificate whose
  Connect sends a Challenge and then only reads.

The devices are simulated by this process (``bench.simdevice.SimDevice``), one TCP+TLS
connection each. They are paired for real (a key pair per device, the public key in its
``devices`` row) and complete the real Challenge/Hello handshake; the gateway counts as
holding them once every device's row names the replica (its handshake sets that). Then:

* **RSS per connection** = (RSS with N connected - RSS before the first connection) / N,
  each the median of 5 readings of the server process's RSS a settle period later.
* **CPU** = the server process's user+system CPU over ``--cpu-seconds`` while holding the N
  idle devices, as % of one core. Devices and server exchange heartbeats at the interval
  the server's Challenge announces (the gateway's default is 15 s), plus HTTP/2 keepalive
  pings with endpointd's options. Postgres's CPU over the same window is reported too.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

from bench.simdevice import (
    KIB,
    MIB,
    Identity,
    SimDevice,
    close_all,
    connect_all,
    fresh_database,
    insert_devices,
    machine_summary,
    markdown_table,
    median_rss,
    own_cpu_seconds,
    postgres_server,
    postgres_version,
    postmaster_pid,
    raise_nofile_limit,
    running_server,
    tree_cpu_seconds,
    wait_connected_in_db,
)

log = logging.getLogger("bench.gateway_fleet")

GOAL_KIB_PER_CONNECTION = 80
GOAL_CPU_PERCENT = 10.0


@dataclasses.dataclass
class FleetRun:
    kind: str
    tls: bool
    heartbeat_seconds: float
    devices: int
    rss_idle: int
    rss_warm: int  # after the first ``warm_devices`` connections
    warm_devices: int
    rss_connected: int
    rss_end: int
    connect_seconds: float
    ready_seconds: float
    window_seconds: float
    cpu_seconds: float
    postgres_cpu_seconds: float
    loadgen_cpu_seconds: float
    heartbeats_to_devices: int
    devices_dropped: int
    threads: int
    open_files: int
    thread_cpu_seconds: dict[str, float]

    @property
    def label(self) -> str:
        return f"{self.kind} ({'TLS' if self.tls else 'plaintext'})"

    @property
    def kib_per_connection(self) -> float:
        return (self.rss_connected - self.rss_idle) / self.devices / KIB

    @property
    def kib_per_connection_marginal(self) -> float:
        """Per connection once the server is warm: one-time costs of the first connections
        (lazy imports, statement caches, the crypto library's set-up) left out."""
        return (self.rss_connected - self.rss_warm) / (self.devices - self.warm_devices) / KIB

    @property
    def warm_up_mib(self) -> float:
        """What the first connections cost beyond the marginal rate, once."""
        return (
            self.rss_warm
            - self.rss_idle
            - self.warm_devices * self.kib_per_connection_marginal * KIB
        ) / MIB

    @property
    def cpu_percent(self) -> float:
        return 100 * self.cpu_seconds / self.window_seconds

    @property
    def postgres_cpu_percent(self) -> float:
        return 100 * self.postgres_cpu_seconds / self.window_seconds

    @property
    def loadgen_cpu_percent(self) -> float:
        return 100 * self.loadgen_cpu_seconds / self.window_seconds


async def measure(
    kind: str,
    identities: Sequence[Identity],
    *,
    url: str,
    tls_dir: Path,
    heartbeat_seconds: float,
    tls: bool,
    args: argparse.Namespace,
    pg_pid: int | None,
) -> FleetRun:
    await reset_connected(url)
    async with running_server(
        kind, database_url=url, tls_dir=tls_dir, heartbeat_seconds=heartbeat_seconds, tls=tls
    ) as server:
        await asyncio.sleep(args.settle_seconds)
        rss_idle = await median_rss(server)
        devices = [SimDevice(identity, server) for identity in identities]
        warm = min(args.warm_devices, len(devices) - 1)
        try:
            await connect_all(devices[:warm], args.connect_concurrency)
            await held(kind, devices[:warm], url)
            await asyncio.sleep(args.settle_seconds)
            rss_warm = await median_rss(server)
            started = time.perf_counter()
            connect_seconds = await connect_all(devices[warm:], args.connect_concurrency)
            await held(kind, devices, url)
            ready_seconds = time.perf_counter() - started
            name = f"{kind} {'TLS' if tls else 'plaintext'} hb={heartbeat_seconds:g}s"
            print(
                f"{name}: {len(devices)} devices connected in "
                f"{connect_seconds:.1f} s, held after {ready_seconds:.1f} s",
                flush=True,
            )
            await asyncio.sleep(args.settle_seconds)
            rss_connected = await median_rss(server)
            heartbeats_before = sum(d.heartbeats_received for d in devices)
            cpu_before = server.cpu_seconds()
            threads_before = server.thread_cpu_seconds()
            pg_before = tree_cpu_seconds(pg_pid)
            own_before = own_cpu_seconds()
            window_start = time.perf_counter()
            await asyncio.sleep(args.cpu_seconds)
            window = time.perf_counter() - window_start
            cpu = server.cpu_seconds() - cpu_before
            threads_after = server.thread_cpu_seconds()
            thread_cpu = {
                name: seconds - threads_before.get(name, 0.0)
                for name, seconds in threads_after.items()
            }
            pg_cpu = tree_cpu_seconds(pg_pid) - pg_before
            own_cpu = own_cpu_seconds() - own_before
            heartbeats = sum(d.heartbeats_received for d in devices) - heartbeats_before
            rss_end = await median_rss(server)
            dropped = sum(1 for d in devices if d.ended.is_set())
            run = FleetRun(
                kind=kind,
                tls=tls,
                heartbeat_seconds=heartbeat_seconds,
                devices=len(devices),
                rss_idle=rss_idle,
                rss_warm=rss_warm,
                warm_devices=warm,
                rss_connected=rss_connected,
                rss_end=rss_end,
                connect_seconds=connect_seconds,
                ready_seconds=ready_seconds,
                window_seconds=window,
                cpu_seconds=cpu,
                postgres_cpu_seconds=pg_cpu,
                loadgen_cpu_seconds=own_cpu,
                heartbeats_to_devices=heartbeats,
                devices_dropped=dropped,
                threads=server.threads(),
                open_files=server.open_files(),
                thread_cpu_seconds=thread_cpu,
            )
            print(
                f"{name}: RSS idle {rss_idle / MIB:.1f} MiB, "
                f"connected {rss_connected / MIB:.1f} MiB "
                f"({run.kib_per_connection:.1f} KiB/connection; "
                f"{run.kib_per_connection_marginal:.1f} once warm, after {warm} connections "
                f"that cost {run.warm_up_mib:.1f} MiB more once), "
                f"CPU {run.cpu_percent:.2f} % over {window:.0f} s, "
                f"Postgres {run.postgres_cpu_percent:.2f} %, "
                f"{heartbeats} heartbeats to devices, {dropped} dropped",
                flush=True,
            )
            return run
        finally:
            await close_all(devices)


async def held(kind: str, devices: Sequence[SimDevice], url: str) -> None:
    """Until the server holds ``devices`` (the gateway: its handshake marked them)."""
    if kind == "gateway":
        await wait_connected_in_db(url, len(devices))
    else:
        await asyncio.wait_for(asyncio.gather(*(d.welcomed.wait() for d in devices)), 300)


def _thread_groups(run: FleetRun) -> str:
    main = run.thread_cpu_seconds.get("main", 0.0)
    engine = sum(v for k, v in run.thread_cpu_seconds.items() if k.startswith("event_engine"))
    other = sum(run.thread_cpu_seconds.values()) - main - engine
    return " / ".join(f"{100 * v / run.window_seconds:.1f} %" for v in (main, engine, other))


def render(runs: Sequence[FleetRun]) -> str:
    def goal(ok: bool) -> str:
        return "yes" if ok else "**no**"

    rows = []
    for run in runs:
        base = next(
            (
                r
                for r in runs
                if r.kind == "baseline"
                and r.tls == run.tls
                and r.heartbeat_seconds == run.heartbeat_seconds
            ),
            None,
        )

        def ratio(value: float, baseline: float | None) -> str:
            return f"{value / baseline:.2f}×" if baseline else "–"

        expected_heartbeats = run.devices * run.window_seconds / run.heartbeat_seconds
        gateway = run.kind == "gateway"
        rows.append(
            [
                run.label,
                f"{run.heartbeat_seconds:g} s",
                f"{run.devices:,}",
                f"{run.rss_idle / MIB:.1f}",
                f"{run.rss_connected / MIB:.1f}",
                f"**{run.kib_per_connection:.1f}**",
                ratio(run.kib_per_connection, base.kib_per_connection if base else None),
                goal(run.kib_per_connection <= GOAL_KIB_PER_CONNECTION) if gateway else "–",
                f"**{run.cpu_percent:.2f} %**",
                ratio(run.cpu_percent, base.cpu_percent if base else None),
                goal(run.cpu_percent <= GOAL_CPU_PERCENT) if gateway else "–",
                f"{run.postgres_cpu_percent:.2f} %",
                f"{run.heartbeats_to_devices:,} / {expected_heartbeats:,.0f}" if gateway else "–",
                str(run.devices_dropped),
            ]
        )
    table = markdown_table(
        [
            "server",
            "heartbeat",
            "devices",
            "RSS idle (MiB)",
            "RSS connected (MiB)",
            "KiB / connection",
            "vs baseline",
            "≤ 80 KiB",
            "server CPU (% of 1 core)",
            "vs baseline",
            "≤ 10 %",
            "Postgres CPU",
            "server heartbeats seen / expected",
            "dropped",
        ],
        rows,
    )
    details = markdown_table(
        [
            "server",
            "heartbeat",
            "CPU: event loop / gRPC event_engine / other threads",
            "RSS after window (MiB)",
            "threads",
            "open fds",
            "connect (all devices)",
            "load-gen CPU",
        ],
        [
            [
                r.label,
                f"{r.heartbeat_seconds:g} s",
                _thread_groups(r),
                f"{r.rss_end / MIB:.1f}",
                r.threads,
                r.open_files,
                f"{r.connect_seconds:.1f} s",
                f"{r.loadgen_cpu_percent:.1f} %",
            ]
            for r in runs
        ],
    )
    return table + "\n\n" + details


async def reset_connected(url: str) -> None:
    """Start each server with every device offline (a previous server may have been killed)."""
    import asyncpg

    from controlplane.db.urls import asyncpg_dsn

    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        await conn.execute("UPDATE devices SET connected_replica = NULL")
    finally:
        await conn.close()


async def run(args: argparse.Namespace, server_url: str) -> list[FleetRun]:
    version = await postgres_version(server_url)
    print("\n".join(f"- {k}: {v}" for k, v in machine_summary(version)), flush=True)
    url = await fresh_database(server_url, "bench_gateway_fleet")
    pg_pid = await postmaster_pid(url)
    started = time.perf_counter()
    identities = await insert_devices(url, args.devices)
    print(
        f"paired {len(identities)} devices (public keys inserted) "
        f"in {time.perf_counter() - started:.1f} s",
        flush=True,
    )
    runs: list[FleetRun] = []
    with tempfile.TemporaryDirectory(prefix="bench-gateway-tls-") as tls_dir:
        for tls in args.tls_modes:
            for heartbeat in args.heartbeats:
                for kind in args.server_kinds:
                    runs.append(
                        await measure(
                            kind,
                            identities,
                            url=url,
                            tls_dir=Path(tls_dir),
                            heartbeat_seconds=heartbeat,
                            tls=tls,
                            args=args,
                            pg_pid=pg_pid,
                        )
                    )
                    await asyncio.sleep(2)
    return runs


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gateway_fleet",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--devices", type=int, default=5000)
    parser.add_argument(
        "--heartbeat-seconds",
        default="15",
        help="comma-separated heartbeat intervals; each is one gateway and one baseline run",
    )
    parser.add_argument("--cpu-seconds", type=float, default=60.0)
    parser.add_argument("--settle-seconds", type=float, default=5.0)
    parser.add_argument(
        "--warm-devices",
        type=int,
        default=50,
        help="connected first, to read RSS once the server is warm (the marginal rate)",
    )
    parser.add_argument("--connect-concurrency", type=int, default=100)
    parser.add_argument("--servers", default="gateway,baseline", help="gateway, baseline or both")
    parser.add_argument(
        "--tls",
        choices=["on", "off", "both"],
        default="on",
        help="off: plaintext gRPC (as behind a TLS-terminating proxy)",
    )
    parser.add_argument(
        "--database-url", default=None, help="a Postgres server (default: embedded pgserver)"
    )
    args = parser.parse_args(argv)
    args.heartbeats = [float(x) for x in args.heartbeat_seconds.split(",") if x.strip()]
    args.server_kinds = [x.strip() for x in args.servers.split(",") if x.strip()]
    if set(args.server_kinds) - {"gateway", "baseline"}:
        parser.error("--servers takes gateway and/or baseline")
    args.tls_modes = {"on": [True], "off": [False], "both": [True, False]}[args.tls]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    logging.basicConfig(level=logging.WARNING)
    limit = raise_nofile_limit()
    if limit < args.devices * 2 + 100:
        print(f"warning: open-file limit {limit} may be too low", file=sys.stderr)
    with postgres_server(args.database_url) as server_url:
        runs = asyncio.run(run(args, server_url))
    print()
    print(render(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
