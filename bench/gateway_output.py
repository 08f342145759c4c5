"""Output throughput: one command printing a lot, streamed through one gateway into Postgres.

Run by hand (never in CI)::

    python -m bench.gateway_output [--mebibytes 200] [--window-mib 8] [--payload text|random]
                                   [--database-url URL]

One gateway replica runs in its own process (``python -m bench.simdevice serve gateway``);
one device (paired with a pairing code and the Pair RPC) is simulated here. The worker
submits one command with ``CommandQueue.submit``; the device answers Accepted and then
streams the output in 64 KiB OutputChunks with byte offsets, as fast as the gateway's acks
allow: at most ``--window-mib`` of unacknowledged output in flight (endpointd's spool works
the same way), then Finished with the total.

* **Throughput** = bytes / time from the first chunk written to the command's result
  being final in Postgres (``CommandQueue.wait``, woken by the done-notification).
* **RSS growth** = the gateway process's peak RSS during the transfer (sampled every 50 ms)
  minus its RSS just before.
* **Integrity**: the stored output is read back with ``CommandQueue.output`` in pages and
  its SHA-256 compared with what the device sent; ``output_size`` and the blob's size too.

Payloads: ``text`` (default) is log-like lines (compressible about 3×, like real command
output; Postgres tries pglz on every stored row), ``random`` is base64 of random bytes
(what pglz cannot compress).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import hashlib
import logging
import os
import random
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

from bench.simdevice import (
    MIB,
    PeakSampler,
    SimDevice,
    close_all,
    connect_all,
    fresh_database,
    machine_summary,
    markdown_table,
    median_rss,
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
from superagent_shared.protocol import MAX_OUTPUT_CHUNK_BYTES

log = logging.getLogger("bench.gateway_output")

GOAL_MB_PER_SECOND = 50.0  # MB = 10^6 bytes
GOAL_RSS_GROWTH = 64 * MIB
PATTERN_BYTES = 8 * MIB  # the payload repeats with this period (> any stored row)


def pattern(kind: str, size: int = PATTERN_BYTES) -> bytes:
    rng = random.Random(20261129)
    if kind == "random":
        raw = base64.encodebytes(rng.randbytes(size * 3 // 4 + 64))
        return raw[:size]
    words = [
        *("compiling", "linking", "test", "passed", "failed", "warning", "src/app/module.py"),
        *(
            "tests/controlplane/api/test_api.py",
            "GET",
            "POST",
            "200",
            "404",
            "ms",
            "bytes",
            "worker",
            "queue",
        ),
        *("retry", "cache", "hit", "miss"),
    ]
    out = bytearray()
    line = 0
    while len(out) < size:
        line += 1
        text = " ".join(rng.choice(words) for _ in range(rng.randint(4, 12)))
        out += f"{line:08d} {rng.getrandbits(64):016x} {text}\n".encode()
    return bytes(out[:size])


@dataclasses.dataclass
class Stream:
    """The device's side: send ``total`` bytes under a window of unacked bytes."""

    total: int
    window: int
    chunks: list[bytes]
    first_chunk_at: float = 0.0
    last_chunk_at: float = 0.0
    final_ack_at: float = 0.0
    waits: int = 0
    started: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    def chunk(self, offset: int) -> bytes:
        index = (offset // MAX_OUTPUT_CHUNK_BYTES) % len(self.chunks)
        return self.chunks[index][: self.total - offset]

    def digest(self) -> str:
        sha = hashlib.sha256()
        for offset in range(0, self.total, MAX_OUTPUT_CHUNK_BYTES):
            sha.update(self.chunk(offset))
        return sha.hexdigest()

    async def run(self, device: SimDevice, command: pb.Command) -> None:
        command_id = command.command_id
        await device.write(pb.DeviceMessage(accepted=pb.Accepted(command_id=command_id)))
        self.first_chunk_at = time.perf_counter()
        self.started.set()
        offset = 0
        while offset < self.total:
            data = self.chunk(offset)
            if offset + len(data) - device.acked.get(command_id, 0) > self.window:
                self.waits += 1
                await device.wait_acked(command_id, offset + len(data) - self.window)
                if device.ended.is_set():
                    raise RuntimeError(f"stream ended: {device.status} {device.details}")
            await device.write(
                pb.DeviceMessage(
                    output=pb.OutputChunk(
                        command_id=command_id,
                        stream=pb.OutputChunk.STREAM_STDOUT,
                        offset=offset,
                        data=data,
                    )
                )
            )
            offset += len(data)
        self.last_chunk_at = time.perf_counter()
        await device.write(
            pb.DeviceMessage(
                finished=pb.Finished(
                    command_id=command_id, exit_code=0, total_output_bytes=self.total
                )
            )
        )
        await device.wait_finished_ack(command_id)
        self.final_ack_at = time.perf_counter()


@dataclasses.dataclass
class OutputResult:
    payload: str
    total: int
    window: int
    seconds: float
    send_seconds: float
    ack_seconds: float
    flow_waits: int
    rss_before: int
    rss_peak: int
    rss_after: int
    gateway_cpu_seconds: float
    postgres_cpu_seconds: float
    loadgen_cpu_seconds: float
    verify_seconds: float
    sha_ok: bool
    size_ok: bool
    state: str

    @property
    def mb_per_second(self) -> float:
        return self.total / self.seconds / 1e6

    @property
    def rss_growth(self) -> int:
        return self.rss_peak - self.rss_before


async def run(args: argparse.Namespace, server_url: str) -> list[OutputResult]:
    from controlplane.db.urls import asyncpg_dsn
    from controlplane.effects.runner import create_pool
    from controlplane.gateway import specs
    from controlplane.gateway.queue import CommandQueue

    version = await postgres_version(server_url)
    print("\n".join(f"- {k}: {v}" for k, v in machine_summary(version)), flush=True)
    url = await fresh_database(server_url, "bench_gateway_output")
    pg_pid = await postmaster_pid(url)
    pool = await create_pool(asyncpg_dsn(url), size=4)
    queue = CommandQueue(pool)
    total = int(args.mebibytes * MIB)
    results: list[OutputResult] = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-gateway-tls-") as tls:
            async with running_server(
                "gateway", database_url=url, tls_dir=Path(tls), heartbeat_seconds=15.0
            ) as server:
                (identity,) = await pair_devices(url, server, 1, prefix="printer")
                for payload in args.payloads:
                    for repeat in range(args.repeat):
                        source = pattern(payload)
                        chunks = [
                            source[i : i + MAX_OUTPUT_CHUNK_BYTES]
                            for i in range(0, len(source), MAX_OUTPUT_CHUNK_BYTES)
                        ]
                        stream = Stream(
                            total=total, window=int(args.window_mib * MIB), chunks=chunks
                        )
                        expected = stream.digest()

                        async def handler(
                            device: SimDevice, command: pb.Command, stream: Stream = stream
                        ) -> None:
                            await stream.run(device, command)

                        device = SimDevice(identity, server, on_command=handler)
                        await connect_all([device], 1)
                        await wait_connected_in_db(url, 1)
                        await asyncio.sleep(2)
                        rss_before = await median_rss(server)
                        gateway_cpu = server.cpu_seconds()
                        pg_cpu = tree_cpu_seconds(pg_pid)
                        own_cpu = own_cpu_seconds()
                        with PeakSampler(server) as sampler:
                            command_id = await queue.submit(
                                identity.device_id,
                                specs.Exec(["sh", "-c", f"head -c {total} /var/log/big.log"]),
                                origin="bench output",
                            )
                            await asyncio.wait_for(stream.started.wait(), 60)
                            result = await queue.wait(command_id, timeout=args.timeout)
                            done_at = time.perf_counter()
                            gateway_cpu = server.cpu_seconds() - gateway_cpu
                            pg_cpu = tree_cpu_seconds(pg_pid) - pg_cpu
                            own_cpu = own_cpu_seconds() - own_cpu
                            await asyncio.wait_for(device.wait_finished_ack(command_id), 60)
                        rss_after = await median_rss(server)
                        seconds = done_at - stream.first_chunk_at
                        print(
                            f"{payload} #{repeat + 1}: {total / MIB:.0f} MiB final in Postgres "
                            f"after {seconds:.2f} s = {total / seconds / 1e6:.1f} MB/s; gateway "
                            f"RSS {rss_before / MIB:.1f} → peak {sampler.peak / MIB:.1f} MiB",
                            flush=True,
                        )
                        started = time.perf_counter()
                        sha = hashlib.sha256()
                        offset = 0
                        page = int(args.page_kib * 1024)
                        while True:
                            data = await queue.output(command_id, offset, page)
                            if not data:
                                break
                            sha.update(data)
                            offset += len(data)
                        verify_seconds = time.perf_counter() - started
                        blob_size = await pool.fetchval(
                            "SELECT b.size FROM commands c JOIN blobs b ON b.id = c.output_blob_id "
                            "WHERE c.id = $1",
                            command_id,
                        )
                        results.append(
                            OutputResult(
                                payload=payload,
                                total=total,
                                window=stream.window,
                                seconds=seconds,
                                send_seconds=stream.last_chunk_at - stream.first_chunk_at,
                                ack_seconds=stream.final_ack_at - stream.first_chunk_at,
                                flow_waits=stream.waits,
                                rss_before=rss_before,
                                rss_peak=sampler.peak,
                                rss_after=rss_after,
                                gateway_cpu_seconds=gateway_cpu,
                                postgres_cpu_seconds=pg_cpu,
                                loadgen_cpu_seconds=own_cpu,
                                verify_seconds=verify_seconds,
                                sha_ok=sha.hexdigest() == expected and offset == total,
                                size_ok=result.output_size == total and blob_size == total,
                                state=result.state,
                            )
                        )
                        await close_all([device])
    finally:
        await pool.close()
    return results


def render(results: Sequence[OutputResult]) -> str:
    rows = []
    for r in results:
        rows.append(
            [
                r.payload,
                f"{r.total / MIB:.0f} MiB",
                f"{r.seconds:.2f} s",
                f"**{r.mb_per_second:.1f} MB/s**",
                f"{r.mb_per_second / GOAL_MB_PER_SECOND:.2f}× ("
                + ("met" if r.mb_per_second >= GOAL_MB_PER_SECOND else "**missed**")
                + ")",
                f"**{r.rss_growth / MIB:.1f} MiB**",
                "met" if r.rss_growth <= GOAL_RSS_GROWTH else "**missed**",
                f"{r.rss_before / MIB:.1f} / {r.rss_peak / MIB:.1f} / {r.rss_after / MIB:.1f}",
                f"{r.gateway_cpu_seconds:.1f} s / {r.postgres_cpu_seconds:.1f} s / "
                f"{r.loadgen_cpu_seconds:.1f} s",
                "yes" if r.sha_ok and r.size_ok and r.state == "finished" else "**NO**",
            ]
        )
    table = markdown_table(
        [
            "payload",
            "output",
            "first chunk → final in PG",
            "throughput",
            "vs goal 50 MB/s",
            "gateway RSS growth",
            "≤ 64 MiB",
            "RSS before / peak / after (MiB)",
            "CPU gateway / Postgres / load gen",
            "sha256 + sizes ok",
        ],
        rows,
    )
    details = markdown_table(
        [
            "payload",
            "device: last chunk sent",
            "final ack at",
            "window",
            "flow-control waits",
            "read back (pages) in",
        ],
        [
            [
                r.payload,
                f"{r.send_seconds:.2f} s",
                f"{r.ack_seconds:.2f} s",
                f"{r.window / MIB:.0f} MiB",
                r.flow_waits,
                f"{r.verify_seconds:.2f} s",
            ]
            for r in results
        ],
    )
    return table + "\n\n" + details


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.gateway_output", description=__doc__)
    parser.add_argument("--mebibytes", type=float, default=200.0, help="output size in MiB")
    parser.add_argument("--window-mib", type=float, default=8.0, help="max unacked in flight")
    parser.add_argument("--payload", default="text,random", help="comma-separated: text, random")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--page-kib", type=float, default=1024.0, help="read-back page size")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument(
        "--database-url", default=None, help="a Postgres server (default: embedded pgserver)"
    )
    args = parser.parse_args(argv)
    args.payloads = [p.strip() for p in args.payload.split(",") if p.strip()]
    if set(args.payloads) - {"text", "random"}:
        parser.error("payloads are text and random")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    logging.basicConfig(level=logging.WARNING)
    raise_nofile_limit()
    os.environ.setdefault("PYTHONHASHSEED", "0")
    with postgres_server(args.database_url) as server_url:
        results = asyncio.run(run(args, server_url))
    print()
    print(render(results))
    ok = all(r.sha_ok and r.size_ok and r.state == "finished" for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
