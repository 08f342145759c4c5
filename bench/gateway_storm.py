"""Reconnect storm: devices with queued commands all come back at once.

Run by hand (never in CI)::

    python -m bench.gateway_storm [--devices 500] [--commands 5] [--database-url URL]

One gateway replica runs in its own process (``python -m bench.simdevice serve gateway``).
The devices are paired for real (pairing codes from ``pairing.create_code``, redeemed with
the Pair RPC), connect once and disconnect, so the gateway has seen them go offline. While
they are offline, ``CommandQueue.submit`` queues ``--commands`` commands for each. Then
every device reconnects at the same moment (no concurrency limit) and answers each Command
with Accepted, one small OutputChunk and Finished, as endpointd does for a short command.

The clock runs from the first reconnect until every command is final in Postgres (counted
from the ``superagent_command_done`` notifications, confirmed by a query). Checks afterwards:

* Postgres: every command ``finished`` with exit 0, its output stored exactly once (one
  ``blob_chunks`` row, ``output_size`` = the bytes sent = the blob's size), and exactly one
  done-notification per command (a second finishing transition would send another);
* devices: each command delivered exactly once, to the device it was queued for.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import logging
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.simdevice import (
    SimDevice,
    close_all,
    connect_all,
    fresh_database,
    insert_devices,
    machine_summary,
    markdown_table,
    own_cpu_seconds,
    pair_devices,
    postgres_server,
    postgres_version,
    postmaster_pid,
    raise_nofile_limit,
    running_server,
    tree_cpu_seconds,
    wait_connected_in_db,
)
from superagent_proto.v1 import endpoint_pb2 as pb

log = logging.getLogger("bench.gateway_storm")

GOAL_SECONDS = 30.0


def output_for(command_id: str) -> bytes:
    return f"{command_id}: ok\n".encode()


async def answer(device: SimDevice, command: pb.Command) -> None:
    """What endpointd sends for a short command: Accepted, its output, Finished."""
    command_id = command.command_id
    await device.write(pb.DeviceMessage(accepted=pb.Accepted(command_id=command_id)))
    if device.deliveries[command_id] > 1:
        return  # a redelivery of a journaled command is only answered with Accepted
    data = output_for(command_id)
    await device.write(
        pb.DeviceMessage(
            output=pb.OutputChunk(
                command_id=command_id,
                stream=pb.OutputChunk.STREAM_STDOUT,
                offset=0,
                data=data,
            )
        )
    )
    await device.write(
        pb.DeviceMessage(
            finished=pb.Finished(command_id=command_id, exit_code=0, total_output_bytes=len(data))
        )
    )


@dataclasses.dataclass
class StormResult:
    devices: int
    commands: int
    pairing_seconds: float
    submit_seconds: float
    connected_seconds: float
    delivered_seconds: float
    finished_seconds: float
    acked_seconds: float | None
    gateway_cpu_seconds: float
    postgres_cpu_seconds: float
    loadgen_cpu_seconds: float
    finished_ok: int
    lost: int
    not_delivered: int
    duplicate_deliveries: int
    misrouted: int
    duplicate_done: int
    bad_output: int
    states: dict[str, int]


async def run(args: argparse.Namespace, server_url: str) -> StormResult:
    import asyncpg

    from controlplane.db.urls import asyncpg_dsn
    from controlplane.domain import TERMINAL_COMMAND_STATES, Notify
    from controlplane.effects.runner import create_pool
    from controlplane.gateway import specs
    from controlplane.gateway.queue import CommandQueue, done_command_id

    version = await postgres_version(server_url)
    print("\n".join(f"- {k}: {v}" for k, v in machine_summary(version)), flush=True)
    url = await fresh_database(server_url, "bench_gateway_storm")
    pg_pid = await postmaster_pid(url)
    dsn = asyncpg_dsn(url)
    pool = await create_pool(dsn, size=8)
    queue = CommandQueue(pool)
    listener = await asyncpg.connect(dsn)
    with tempfile.TemporaryDirectory(prefix="bench-gateway-tls-") as tls:
        async with running_server(
            "gateway", database_url=url, tls_dir=Path(tls), heartbeat_seconds=15.0
        ) as server:
            started = time.perf_counter()
            if args.pairing == "rpc":
                identities = await pair_devices(url, server, args.devices)
            else:
                identities = await insert_devices(url, args.devices)
            pairing_seconds = time.perf_counter() - started
            print(f"paired {len(identities)} devices in {pairing_seconds:.1f} s", flush=True)

            # Online once, then offline: the gateway has registered and dropped every device.
            devices = [SimDevice(identity, server) for identity in identities]
            await connect_all(devices, 100)
            await wait_connected_in_db(url, len(devices))
            await close_all(devices)
            deadline = time.perf_counter() + 10
            while stale := await pool.fetchval(
                "SELECT count(*) FROM devices WHERE connected_replica IS NOT NULL"
            ):
                if time.perf_counter() > deadline:
                    print(f"warning: {stale} devices still listed as connected", flush=True)
                    break
                await asyncio.sleep(0.1)

            started = time.perf_counter()
            owner: dict[str, str] = {}
            gate = asyncio.Semaphore(8)

            async def submit_for(device_id: str) -> None:
                async with gate:
                    for index in range(args.commands):
                        command_id = await queue.submit(
                            device_id,
                            specs.Exec(["sh", "-c", f"echo storm {index}"]),
                            origin="bench storm",
                        )
                        owner[command_id] = device_id

            await asyncio.gather(*(submit_for(i.device_id) for i in identities))
            submit_seconds = time.perf_counter() - started
            total = len(owner)
            print(f"queued {total} commands in {submit_seconds:.1f} s", flush=True)

            done_counts: collections.Counter[str] = collections.Counter()
            all_done = asyncio.Event()

            def on_done(_conn: Any, _pid: int, _channel: str, payload: object) -> None:
                done_counts[done_command_id(str(payload))] += 1
                if len(done_counts) >= total:
                    all_done.set()

            await listener.add_listener(Notify.COMMAND_DONE, on_done)

            first_delivery: dict[str, float] = {}

            async def handler(device: SimDevice, command: pb.Command) -> None:
                first_delivery.setdefault(command.command_id, time.perf_counter())
                await answer(device, command)

            devices = [SimDevice(identity, server, on_command=handler) for identity in identities]
            gateway_cpu = server.cpu_seconds()
            pg_cpu = tree_cpu_seconds(pg_pid)
            own_cpu = own_cpu_seconds()
            started = time.perf_counter()
            connected_seconds = await connect_all(devices, len(devices))  # all at once

            async def poll() -> None:  # the safety net for a notification lost on the way
                while not all_done.is_set():
                    await asyncio.sleep(0.5)
                    final = await pool.fetchval(
                        "SELECT count(*) FROM commands WHERE state = ANY($1::text[])",
                        list(TERMINAL_COMMAND_STATES),
                    )
                    if final >= total:
                        all_done.set()
                    elapsed = time.perf_counter() - started
                    if args.progress and int(elapsed * 2) % 10 == 0:
                        delivered = sum(len(d.deliveries) for d in devices)
                        print(
                            f"  {elapsed:.0f} s: {final} final, {len(done_counts)} notified, "
                            f"{delivered} delivered",
                            flush=True,
                        )

            poller = asyncio.create_task(poll())
            timed_out = False
            try:
                await asyncio.wait_for(all_done.wait(), args.timeout)
            except TimeoutError:
                timed_out = True
            finally:
                poller.cancel()
            finished_seconds = time.perf_counter() - started
            if timed_out:
                print(f"TIMEOUT after {args.timeout:.0f} s; not final:", flush=True)
                by_id = {d.device_id: d for d in devices}
                for row in await pool.fetch(
                    "SELECT id, device_id, state, output_size, total_output_bytes FROM commands "
                    "WHERE NOT state = ANY($1::text[]) ORDER BY device_id, seq",
                    list(TERMINAL_COMMAND_STATES),
                ):
                    device = by_id[row["device_id"]]
                    stream = (
                        f"ended {device.status} {device.details}"
                        if device.ended.is_set()
                        else "open"
                    )
                    print(
                        f"  {row['id']} of {row['device_id']}: {row['state']}, output "
                        f"{row['output_size']}/{row['total_output_bytes']}; device stream "
                        f"{stream}, "
                        f"acked {device.acked.get(row['id'])}, "
                        f"finished ack {row['id'] in device.finished_acks}",
                        flush=True,
                    )
            gateway_cpu = server.cpu_seconds() - gateway_cpu
            pg_cpu = tree_cpu_seconds(pg_pid) - pg_cpu
            own_cpu = own_cpu_seconds() - own_cpu
            delivered_seconds = max(first_delivery.values(), default=started) - started
            print(
                f"all {total} commands final after {finished_seconds:.2f} s "
                f"(all reconnects returned after {connected_seconds:.2f} s, "
                f"last first delivery at {delivered_seconds:.2f} s)",
                flush=True,
            )

            acked_seconds: float | None = None
            try:
                await asyncio.wait_for(
                    asyncio.gather(
                        *(d.wait_finished_ack(c) for d in devices for c in d.deliveries)
                    ),
                    30,
                )
                acked_seconds = time.perf_counter() - started
            except TimeoutError:
                pass
            await asyncio.sleep(1)  # late duplicates, if any, would show up now
            await listener.remove_listener(Notify.COMMAND_DONE, on_done)

            deliveries: collections.Counter[str] = collections.Counter()
            misrouted = 0
            for device in devices:
                for command_id, count in device.deliveries.items():
                    deliveries[command_id] += count
                    if owner.get(command_id) != device.device_id:
                        misrouted += 1
            rows = await pool.fetch(
                """
                SELECT c.id, c.state, c.exit_code, c.output_size, c.total_output_bytes,
                       b.size AS blob_size,
                       (SELECT count(*) FROM blob_chunks k WHERE k.blob_id = c.output_blob_id)
                           AS chunk_rows,
                       (SELECT string_agg(k.data, ''::bytea ORDER BY k."offset")
                        FROM blob_chunks k WHERE k.blob_id = c.output_blob_id) AS stored
                FROM commands c JOIN blobs b ON b.id = c.output_blob_id
                WHERE c.id = ANY($1::text[])
                """,
                list(owner),
            )
            await close_all(devices)

    await listener.close()
    await pool.close()
    states = collections.Counter(str(row["state"]) for row in rows)
    finished_ok = sum(1 for row in rows if row["state"] == "finished" and row["exit_code"] == 0)
    bad_output = 0
    for row in rows:
        expected = output_for(row["id"])
        if (
            row["chunk_rows"] != 1
            or bytes(row["stored"] or b"") != expected
            or row["output_size"] != len(expected)
            or row["blob_size"] != len(expected)
            or row["total_output_bytes"] != len(expected)
        ):
            bad_output += 1
    return StormResult(
        devices=len(identities),
        commands=total,
        pairing_seconds=pairing_seconds,
        submit_seconds=submit_seconds,
        connected_seconds=connected_seconds,
        delivered_seconds=delivered_seconds,
        finished_seconds=finished_seconds,
        acked_seconds=acked_seconds,
        gateway_cpu_seconds=gateway_cpu,
        postgres_cpu_seconds=pg_cpu,
        loadgen_cpu_seconds=own_cpu,
        finished_ok=finished_ok,
        lost=total - finished_ok,
        not_delivered=sum(1 for c in owner if deliveries[c] == 0),
        duplicate_deliveries=sum(n - 1 for n in deliveries.values() if n > 1),
        misrouted=misrouted,
        duplicate_done=sum(n - 1 for n in done_counts.values() if n > 1),
        bad_output=bad_output,
        states=dict(states),
    )


def render(result: StormResult) -> str:
    ok = result.finished_seconds <= GOAL_SECONDS
    timing = markdown_table(
        ["measure", "value"],
        [
            ["devices × commands", f"{result.devices} × {result.commands // result.devices}"],
            [
                "**time until all commands final in Postgres**",
                f"**{result.finished_seconds:.2f} s** (goal ≤ {GOAL_SECONDS:.0f} s: "
                f"{'met' if ok else '**missed**'}, "
                f"{result.finished_seconds / GOAL_SECONDS:.2f}× of the budget)",
            ],
            ["commands finished per second", f"{result.commands / result.finished_seconds:.0f}"],
            ["all reconnect handshakes returned after", f"{result.connected_seconds:.2f} s"],
            ["last command first delivered after", f"{result.delivered_seconds:.2f} s"],
            [
                "all Finished acks back on devices after",
                f"{result.acked_seconds:.2f} s" if result.acked_seconds is not None else "–",
            ],
            [
                "CPU during the storm (gateway / Postgres / load gen)",
                f"{result.gateway_cpu_seconds:.1f} s / {result.postgres_cpu_seconds:.1f} s / "
                f"{result.loadgen_cpu_seconds:.1f} s",
            ],
            [
                "(untimed) pairing, queueing",
                f"{result.pairing_seconds:.1f} s, {result.submit_seconds:.1f} s",
            ],
        ],
    )
    checks = markdown_table(
        ["check", "count"],
        [
            ["commands finished with exit 0, recorded once", f"{result.finished_ok:,}"],
            ["lost (not final / not finished)", result.lost],
            ["never delivered", result.not_delivered],
            ["duplicate deliveries seen by devices", result.duplicate_deliveries],
            ["delivered to the wrong device", result.misrouted],
            ["duplicate done-notifications (finished twice)", result.duplicate_done],
            ["output not stored exactly once", result.bad_output],
            ["states", ", ".join(f"{k}: {v}" for k, v in sorted(result.states.items()))],
        ],
    )
    return timing + "\n\n" + checks


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.gateway_storm", description=__doc__)
    parser.add_argument("--devices", type=int, default=500)
    parser.add_argument("--commands", type=int, default=5, help="queued commands per device")
    parser.add_argument(
        "--pairing",
        choices=["rpc", "insert"],
        default="rpc",
        help="rpc: pairing codes and the Pair RPC; insert: public keys written directly",
    )
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--progress", action="store_true", help="print progress every 5 s")
    parser.add_argument(
        "--database-url", default=None, help="a Postgres server (default: embedded pgserver)"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    logging.basicConfig(level=logging.WARNING)
    raise_nofile_limit()
    with postgres_server(args.database_url) as server_url:
        result = asyncio.run(run(args, server_url))
    print()
    print(render(result))
    clean = (
        result.lost
        + result.not_delivered
        + result.duplicate_deliveries
        + result.misrouted
        + result.duplicate_done
        + result.bad_output
    ) == 0
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
