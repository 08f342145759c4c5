"""Redaction throughput: a 200 MB stream through endpointd's StreamRedactor against a plain copy.

Run by hand (never in CI)::

    python -m bench.redaction [--mode stream|daemon] [--megabytes 200] [--credentials 20]
                              [--pem-keys 1] [--rounds 5] [--chunk-kib 64]
                              [--sinks devnull,memory,file] [--engine auto|hyperscan|python]
                              [--min-literals N] [--profile]

Two modes. ``--mode stream`` (the default) times the redactor alone against an in-process
copy loop, described first. ``--mode daemon`` times the device's outbound path, described at
the end.

The stream alternates log-like text lines and base64-looking lines (76 characters of base64 of
random bytes, as in a dump of keys or blobs). Ten of the credential values are planted in it
four times each: raw across a chunk boundary, URL- and JSON-encoded, and inside the base64 of
``userN:value`` (as in a Basic auth header, so at a shift). It is read in ``--chunk-kib``
chunks from an in-memory ``io.BytesIO`` and written to a sink by loops that differ in one line:

* **copy**: ``sink.write(chunk)``;
* **redact**: ``sink.write(stream.feed(chunk))`` (and ``stream.flush()`` at the end), with a
  :class:`endpointd.secrets.redact.Redactor` holding ``--credentials`` values of realistic shapes
  (tokens, keys, passwords with quotes and spaces; ``--pem-keys`` of them multi-line private
  keys);
* **no credentials**: the same with an empty Redactor (the pass-through).

Sinks: ``devnull`` (``os.write`` to /dev/null: a syscall per chunk, no copy), ``memory`` (the
chunk copied into a preallocated ``bytearray``) and ``file`` (``os.write`` to an ``O_APPEND``
file in a temporary directory, as endpointd's spool writer does; truncated between passes).
The loops take turns for ``--rounds`` rounds per sink; the table gives the median MB/s
(MB = 10^6 bytes) and the ratio of the redact loop's time to the copy loop's. Before timing,
the redacted output is checked: same length, no planted form left, every changed byte a '*'.
``--min-literals 0`` compiles without the filler literals (see ``MIN_LITERALS`` in
endpointd/secrets/redact.py), to measure what they are for.

**Daemon path** (``--mode daemon``): the same stream is written once with the exec
supervisor's :class:`endpointd.spool.SpoolWriter` (stdout records of ``--chunk-kib``, as the
supervisor appends what each pipe read returns) into a temporary state directory. Two real
:class:`endpointd.commands.daemon.Daemon` instances are built as
tests/endpointd/process/test_supervise.py's
``_daemon()`` does (no zygote): **plain**, with no credentials store (the pass-through: the
plain copy of the stream through the device's path), and **redact**, with a store whose
``values()`` returns the ``--credentials`` values. In alternating rounds each gets an
``Active`` for a finished exec (total = the spool's size, a Finished result) in
``daemon.commands`` and is drained with ``next_output_message()`` until the result, each
message serialized with ``SerializeToString()`` (what gRPC does with it). Not included: gRPC's
framing, HTTP/2 and TLS, and the asyncio queue the connection reads from. The spool is in the
page cache (just written). Before timing, one drain of each is checked: offsets contiguous,
the plain bytes equal to the stream, the redacted ones equal to a bare StreamRedactor's output
over the same stream and passing the stream mode's check (same length, no planted form left,
every changed byte a '*'). ``--profile`` then runs one drain of each under cProfile.
"""

from __future__ import annotations

import argparse
import base64
import cProfile
import importlib.metadata
import io
import json
import os
import platform
import pstats
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

from endpointd.secrets import redact
from endpointd.secrets.redact import Redactor

if TYPE_CHECKING:
    from endpointd.commands.daemon import Daemon
    from endpointd.secrets.store import CredentialStore

GOAL_MB_PER_SECOND = 100.0
GOAL_RATIO = 2.0
WORDS = (
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
    *("retry", "cache", "hit", "miss", "token", "auth", "user", "Authorization:", "Bearer"),
)


def credentials(count: int, rng: random.Random, pem_keys: int = 1) -> dict[str, bytes]:
    """``count`` values shaped like real ones: tokens, keys, passwords, ``pem_keys`` PEM keys."""
    alnum = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"

    def pick(alphabet: str, n: int) -> str:
        return "".join(rng.choice(alphabet) for _ in range(n))

    shapes: list[Callable[[], str]] = [
        lambda: "ghp_" + pick(alnum, 36),  # GitHub token
        lambda: "AKIA" + pick(alnum.upper()[:36], 16),  # AWS key id
        lambda: pick(alnum + "+/", 40),  # AWS secret key
        lambda: "sk-" + pick(alnum, 48),  # API key
        lambda: pick("0123456789abcdef", 32),  # hex secret
        lambda: pick(alnum + " \"'\\/+&%$!é", 20),  # a password that needs escaping
        lambda: (
            "xoxb-" + "-".join(pick("0123456789", 12) for _ in range(2)) + "-" + pick(alnum, 24)
        ),
        lambda: ".".join(  # a JWT
            base64.urlsafe_b64encode(rng.randbytes(n)).rstrip(b"=").decode() for n in (27, 96, 32)
        ),
    ]
    values = {}
    for i in range(count - pem_keys):
        values[f"cred{i:02d}"] = shapes[i % len(shapes)]().encode()
    for i in range(pem_keys):
        body = base64.b64encode(rng.randbytes(1190)).decode()
        lines = [body[i : i + 64] for i in range(0, len(body), 64)]  # 64 columns, like PEM
        pem = ["-----BEGIN PRIVATE KEY-----", *lines, "-----END PRIVATE KEY-----", ""]
        values[f"key{i:02d}"] = "\n".join(pem).encode()
    return values


def planted_forms(value: bytes) -> list[bytes]:
    """A few ways a command prints a value (each fully maskable, see test_redact)."""
    return [
        value,
        urllib.parse.quote(value, safe="").encode(),
        json.dumps(value.decode("utf-8"))[1:-1].encode(),
    ]


def build_stream(size: int, values: dict[str, bytes], rng: random.Random, chunk: int) -> bytes:
    """``size`` bytes: text and base64 lines, with planted values at recorded offsets."""
    out = bytearray()
    noise = base64.b64encode(rng.randbytes(size // 2))
    pos = 0
    line = 0
    while len(out) < size:
        line += 1
        if line % 2:
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12)))
            out += f"{line:08d} {rng.getrandbits(64):016x} {text}\n".encode()
        else:
            out += noise[pos : pos + 76] + b"\n"
            pos = (pos + 76) % (len(noise) - 76)
    del out[size:]
    # Plant 40 forms of 10 values: at random offsets, the raw ones across a chunk boundary.
    for i, value in enumerate(list(values.values())[:10]):
        for j, form in enumerate(planted_forms(value)):
            at = rng.randrange(0, size - len(form))
            if j == 0:
                boundary = rng.randrange(1, size // chunk) * chunk
                at = boundary - rng.randrange(1, len(form))
            out[at : at + len(form)] = form
        # base64 of "user:" + value: the value sits at a shift inside the encoding.
        encoded = base64.b64encode(b"user%d:" % i + value)
        at = rng.randrange(0, size - len(encoded))
        out[at : at + len(encoded)] = encoded
    return bytes(out)


class MemorySink:
    """Writes into a preallocated buffer: the cost of a copy and nothing else."""

    def __init__(self, size: int) -> None:
        self.buffer = bytearray(size)
        self.view = memoryview(self.buffer)
        self.pos = 0

    def reset(self) -> None:
        self.pos = 0

    def write(self, data: bytes) -> None:
        end = self.pos + len(data)
        self.view[self.pos : end] = data
        self.pos = end

    def close(self) -> None:
        self.view.release()


class FdSink:
    """``os.write`` per chunk, as endpointd's spool writer does: to /dev/null or to a file."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        self.truncate = path != os.devnull

    def reset(self) -> None:
        if self.truncate:
            os.ftruncate(self.fd, 0)

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]

    def close(self) -> None:
        os.close(self.fd)


Sink = MemorySink | FdSink


def copy_pass(source: bytes, sink: Sink, chunk: int) -> float:
    reader = io.BytesIO(source)
    read, write = reader.read, sink.write
    start = time.perf_counter()
    while data := read(chunk):
        write(data)
    return time.perf_counter() - start


def redact_pass(source: bytes, sink: Sink, chunk: int, redactor: Redactor) -> float:
    reader = io.BytesIO(source)
    read, write = reader.read, sink.write
    start = time.perf_counter()
    stream = redactor.stream()
    feed = stream.feed
    while data := read(chunk):
        write(feed(data))
    write(stream.flush())
    return time.perf_counter() - start


def redact_all(source: bytes, chunk: int, redactor: Redactor) -> bytes:
    stream = redactor.stream()
    parts = [stream.feed(source[i : i + chunk]) for i in range(0, len(source), chunk)]
    parts.append(stream.flush())
    return b"".join(parts)


def verify(source: bytes, output: bytes, values: dict[str, bytes], chunk: int) -> str:
    if len(output) != len(source):
        return f"FAILED: length {len(output)} != {len(source)}"
    for value in values.values():
        for form in planted_forms(value):
            if form in output:
                return "FAILED: a planted value survived"
    changed = 0
    for at in range(0, len(source), chunk):
        a, b = source[at : at + chunk], output[at : at + chunk]
        if a != b:
            if any(y != ord("*") for x, y in zip(a, b, strict=True) if x != y):
                return "FAILED: a byte changed to something other than '*'"
            changed += sum(1 for x, y in zip(a, b, strict=True) if x != y)
    return f"ok ({changed:,} bytes masked)"


def code_version() -> str:
    try:
        proc = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except OSError:
        return "unknown"
    return proc.stdout.strip() or "unknown"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def print_machine() -> None:
    try:
        hs_version = importlib.metadata.version("hyperscan")
    except importlib.metadata.PackageNotFoundError:
        hs_version = "not installed"
    print(f"code {code_version()}, Python {platform.python_version()}, hyperscan {hs_version}")
    print(f"CPU {os.cpu_count()} × {cpu_model()}, load average {os.getloadavg()[0]:.2f}")


def run_stream(args: argparse.Namespace) -> int:
    if args.min_literals is not None:  # e.g. 0: Hyperscan without the filler literals
        setattr(redact, "MIN_LITERALS", args.min_literals)  # noqa: B010 (a Final constant)
    rng = random.Random(args.seed)
    size = int(args.megabytes * 1_000_000)
    chunk = int(args.chunk_kib * 1024)
    values = credentials(args.credentials, rng, args.pem_keys)

    tracemalloc.start()
    started = time.perf_counter()
    redactor = Redactor(values, engine=args.engine)
    compile_ms = (time.perf_counter() - started) * 1000
    python_bytes = tracemalloc.get_traced_memory()[0]
    stream = redactor.stream()
    stream_bytes = tracemalloc.get_traced_memory()[0] - python_bytes
    tracemalloc.stop()
    del stream

    print_machine()
    print(
        f"{len(values)} credentials → {redactor.pattern_count} patterns (longest "
        f"{redactor.max_len} bytes), engine {redactor.engine}, compiled in {compile_ms:.1f} ms; "
        f"database {redactor.database_size / 1024:.0f} KiB, Python-side "
        f"{python_bytes / 1024:.0f} KiB, per stream {stream_bytes / 1024:.1f} KiB"
    )

    source = build_stream(size, values, rng, chunk)
    print(f"stream {len(source) / 1e6:.0f} MB in {chunk // 1024} KiB chunks")
    print("verify:", verify(source, redact_all(source, chunk, redactor), values, chunk))
    empty = Redactor.empty()

    rows = []
    for sink_name in args.sinks:
        with tempfile.TemporaryDirectory(prefix="bench-redaction-") as tmp:
            sink: Sink
            if sink_name == "memory":
                sink = MemorySink(size)
            elif sink_name == "file":
                sink = FdSink(os.path.join(tmp, "output"))
            else:
                sink = FdSink(os.devnull)
            times: dict[str, list[float]] = {"copy": [], "redact": [], "empty": []}
            for _ in range(args.rounds):
                for name in ("copy", "redact", "empty"):
                    sink.reset()
                    if name == "copy":
                        times[name].append(copy_pass(source, sink, chunk))
                    else:
                        red = redactor if name == "redact" else empty
                        times[name].append(redact_pass(source, sink, chunk, red))
            sink.close()
        copy_s = statistics.median(times["copy"])
        redact_s = statistics.median(times["redact"])
        empty_s = statistics.median(times["empty"])
        verdict = "met" if redact_s / copy_s <= GOAL_RATIO else "not met"
        mbps = {k: len(source) / statistics.median(v) / 1e6 for k, v in times.items()}
        rows.append(
            (
                sink_name,
                f"{mbps['copy']:,.0f}",
                f"{mbps['redact']:,.0f}",
                f"{redact_s / copy_s:.2f}× ({verdict})",
                f"{(redact_s - copy_s) / (len(source) / chunk) * 1e6:.1f}",
                f"{mbps['empty']:,.0f} ({empty_s / copy_s:.2f}×)",
                " / ".join(f"{len(source) / t / 1e6:,.0f}" for t in times["redact"]),
            )
        )
    header = (
        "sink",
        "copy MB/s",
        f"**redact MB/s** (≥ {GOAL_MB_PER_SECOND:g})",
        f"redact / copy time (≤ {GOAL_RATIO:g}×)",
        "added µs per chunk",
        "no credentials MB/s (/ copy)",
        "redact MB/s per round",
    )
    print()
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


# ---------------------------------------------------------------------------- daemon path

COMMAND_ID = "bench-output"


class BenchCredentials:
    """What :meth:`Daemon.redactor` uses of a CredentialStore: ``path`` (stat'd to notice
    changes) and ``values()``; ``get`` and ``touch`` for completeness. No keyring involved.
    """

    def __init__(self, directory: Path, values: Mapping[str, bytes]) -> None:
        self._values = dict(values)
        self.path = directory / "credentials.json"
        index = {name: {"added_at": "2026-11-30T00:00:00+00:00"} for name in self._values}
        self.path.write_text(json.dumps(index))

    def values(self) -> dict[str, bytes]:
        return dict(self._values)

    def get(self, name: str) -> bytes | None:
        return self._values.get(name)

    def touch(self, name: str) -> None:
        pass


def make_daemon(state_dir: Path, credentials: BenchCredentials | None) -> Daemon:
    """A Daemon as test_supervise.py's ``_daemon()`` builds one, no zygote."""
    from endpointd.commands.daemon import Daemon
    from endpointd.config import DeviceConfig, KeyConfig, TrustConfig
    from endpointd.guard.policy import Policy
    from endpointd.journal import Journal
    from endpointd.process.executor import ExecLimits
    from endpointd.status import StatusReporter

    (state_dir / "spool").mkdir(parents=True)
    config = DeviceConfig(
        server_url="http://127.0.0.1:1",
        device_id="bench",
        device_name="bench",
        server_name="srv",
        trust=TrustConfig(mode="plaintext"),
        key=KeyConfig(storage="file", path=str(state_dir / "device.key")),
        public_key="00" * 32,
        paired_at="2026-01-01T00:00:00+00:00",
    )
    policy_file = state_dir / "config" / "policy.toml"
    policy_file.parent.mkdir()
    policy_file.write_text(f"allowed_roots = [{json.dumps(str(state_dir))}]\n")
    policy_file.chmod(0o600)
    return Daemon(
        config,
        state_directory=state_dir,
        journal=Journal(state_dir / "journal.sqlite3"),
        policy=Policy(policy_file, state_dir=state_dir / "elsewhere"),
        status=StatusReporter(state_dir, state="connected"),
        limits=ExecLimits(max_timeout_seconds=60),
        default_cwd=state_dir,
        use_zygote=False,
        credentials=cast("CredentialStore | None", credentials),
    )


def arm(daemon: Daemon, spool: Path, total: int) -> None:
    """Put a finished exec whose output is ``spool`` in ``daemon.commands``, nothing sent yet."""
    from endpointd.commands.daemon import Active
    from superagent_shared.messages import Command, Exec, Finished

    command = Command(command_id=COMMAND_ID, seq=1, op=Exec(argv=("bench",)))
    result = Finished(command_id=COMMAND_ID, exit_code=0, total_output_bytes=total)
    daemon.commands.clear()
    daemon.commands[COMMAND_ID] = Active(
        command_id=COMMAND_ID,
        seq=1,
        command=command,
        state="finished",
        spool=spool,
        result=result,
        total=total,
    )


def disarm(daemon: Daemon) -> None:
    active = daemon.commands.pop(COMMAND_ID)
    if active.reader is not None:
        active.reader.close()


def drain_pass(daemon: Daemon, spool: Path, total: int) -> tuple[float, float, int, int, int]:
    """One drain until the result: (wall s, CPU s, messages, serialized bytes, page faults)."""
    arm(daemon, spool, total)
    next_message = daemon.next_output_message
    messages = wire = 0
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    cpu = time.process_time()
    start = time.perf_counter()
    while True:
        message = next_message()
        if message is None:
            raise RuntimeError("next_output_message() returned None before the result")
        wire += len(message.SerializeToString())
        messages += 1
        if message.HasField("finished"):
            break
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    disarm(daemon)
    return elapsed, cpu, messages, wire, faults


def drain_collect(daemon: Daemon, spool: Path, total: int) -> tuple[bytes, list[int], str]:
    """One drain, untimed, keeping the data: (bytes, chunk sizes, problems or '')."""
    from endpointd.spool import STREAM_STDOUT

    arm(daemon, spool, total)
    parts: list[bytes] = []
    sizes: list[int] = []
    offset = 0
    problem = ""
    while True:
        message = daemon.next_output_message()
        if message is None:
            problem = "stalled before the result"
            break
        if message.HasField("finished"):
            break
        chunk = message.output
        if chunk.offset != offset or chunk.stream != STREAM_STDOUT:
            problem = f"chunk at {chunk.offset} (stream {chunk.stream}), expected {offset}"
            break
        parts.append(chunk.data)
        sizes.append(len(chunk.data))
        offset += len(chunk.data)
    if not problem and daemon.next_output_message() is not None:
        problem = "a message after the result"
    disarm(daemon)
    return b"".join(parts), sizes, problem


def feed_pass(source: bytes, chunk: int, redactor: Redactor | None) -> float:
    """Read ``source`` from memory in ``chunk`` bytes and feed each to a stream (None: only
    read). The difference of the two is the StreamRedactor's own cost, for comparison.
    """
    reader = io.BytesIO(source)
    read = reader.read
    start = time.perf_counter()
    if redactor is None:
        while read(chunk):
            pass
    else:
        stream = redactor.stream()
        feed = stream.feed
        while data := read(chunk):
            feed(data)
        stream.flush()
    return time.perf_counter() - start


def profile_pass(daemon: Daemon, spool: Path, total: int, label: str, top: int) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    elapsed = drain_pass(daemon, spool, total)[0]
    profiler.disable()
    print(f"\ncProfile, {label} (one drain, {elapsed:.2f} s under the profiler), by tottime:")
    stats = pstats.Stats(profiler, stream=sys.stdout)
    stats.sort_stats("tottime").print_stats(top)


def run_daemon(args: argparse.Namespace) -> int:
    from endpointd.spool import STREAM_STDOUT, SpoolWriter
    from superagent_shared.protocol import MAX_OUTPUT_CHUNK_BYTES

    if args.engine != "auto":  # the daemon builds Redactor(values) with engine="auto"
        os.environ["ENDPOINTD_REDACT_ENGINE"] = args.engine
    rng = random.Random(args.seed)
    size = int(args.megabytes * 1_000_000)
    record = int(args.chunk_kib * 1024)
    values = credentials(args.credentials, rng, args.pem_keys)
    print_machine()
    source = build_stream(size, values, rng, record)
    load_before = os.getloadavg()

    with tempfile.TemporaryDirectory(prefix="bench-redaction-daemon-") as tmp:
        root = Path(tmp)
        spool = root / "spool" / COMMAND_ID
        spool.mkdir(parents=True)
        writer = SpoolWriter(spool)
        started = time.perf_counter()
        for at in range(0, size, record):
            writer.append(STREAM_STDOUT, source[at : at + record])
        writer.close()
        write_s = time.perf_counter() - started
        spool_size = (spool / "output").stat().st_size
        print(
            f"spool {size / 1e6:.0f} MB of stdout in {record // 1024} KiB records "
            f"({spool_size:,} bytes on disk), written in {write_s:.2f} s"
        )

        plain = make_daemon(root / "plain", None)
        masked = make_daemon(root / "redact", BenchCredentials(root, values))
        try:
            started = time.perf_counter()
            redactor = masked.redactor()  # built once, then kept while the store is unchanged
            compile_ms = (time.perf_counter() - started) * 1000
            print(
                f"{len(values)} credentials → {redactor.pattern_count} patterns, engine "
                f"{redactor.engine}, built by Daemon.redactor() in {compile_ms:.1f} ms; the plain "
                f"daemon's: engine {plain.redactor().engine}"
            )

            plain_out, plain_sizes, problem = drain_collect(plain, spool, size)
            ok = not problem and plain_out == source
            print(
                "verify plain:",
                "ok (identical to the stream)" if ok else f"FAILED {problem or 'bytes differ'}",
            )
            del plain_out
            masked_out, masked_sizes, problem = drain_collect(masked, spool, size)
            reference = redact_all(source, record, Redactor(values))
            if problem:
                verdict = f"FAILED: {problem}"
            elif masked_out != reference:
                verdict = "FAILED: differs from a bare StreamRedactor's output"
            else:
                verdict = verify(source, masked_out, values, record) + ", = StreamRedactor's"
            print("verify redact:", verdict)
            del masked_out, reference
            for label, sizes in (("plain", plain_sizes), ("redact", masked_sizes)):
                print(
                    f"  {label}: {len(sizes):,} OutputChunks, mean {statistics.mean(sizes):,.0f} "
                    f"B, {sum(1 for n in sizes if n < 64 * 1024):,} under 64 KiB"
                )

            daemons = {"plain": plain, "redact": masked}
            wall: dict[str, list[float]] = {"plain": [], "redact": []}
            cpu: dict[str, list[float]] = {"plain": [], "redact": []}
            faults: dict[str, list[int]] = {"plain": [], "redact": []}
            counts: dict[str, tuple[int, int]] = {}
            loads = []
            for _ in range(args.rounds):
                for name, daemon in daemons.items():
                    elapsed, used, messages, wire, fault = drain_pass(daemon, spool, size)
                    wall[name].append(elapsed)
                    cpu[name].append(used)
                    faults[name].append(fault)
                    counts[name] = (messages, wire)
                loads.append(os.getloadavg()[0])
            # After the rounds, for attribution: the redactor alone on the daemon's chunks
            # (64 KiB spool reads), read from memory, less the reads; rounds alternate.
            feed_times: dict[str, list[float]] = {"read": [], "feed": []}
            for _ in range(args.rounds):
                for name, red in (("read", None), ("feed", redactor)):
                    feed_times[name].append(feed_pass(source, MAX_OUTPUT_CHUNK_BYTES, red))

            if args.profile:
                for name, daemon in daemons.items():
                    profile_pass(daemon, spool, size, name, args.profile_top)
        finally:
            for daemon in (plain, masked):
                daemon.close()
                daemon.journal.close()

    plain_s, redact_s = statistics.median(wall["plain"]), statistics.median(wall["redact"])
    feed_s = statistics.median(feed_times["feed"]) - statistics.median(feed_times["read"])
    ratios = [r / p for p, r in zip(wall["plain"], wall["redact"], strict=True)]
    cpu_ratio = statistics.median(cpu["redact"]) / statistics.median(cpu["plain"])
    chunks = counts["plain"][0] - 1
    mbps = len(source) / redact_s / 1e6
    print(
        f"\nload average 1/5/15 min: before {'/'.join(f'{x:.2f}' for x in load_before)}, "
        f"after each round {', '.join(f'{x:.2f}' for x in loads)}"
    )
    for name in ("plain", "redact"):
        messages, wire = counts[name]
        print(
            f"{name}: {messages:,} messages, {wire / 1e6:,.1f} MB serialized; MB/s per round "
            + " / ".join(f"{len(source) / t / 1e6:,.0f}" for t in wall[name])
            + "; CPU/wall "
            + " / ".join(f"{c / t:.2f}" for c, t in zip(cpu[name], wall[name], strict=True))
            + "; page faults "
            + " / ".join(f"{n:,}" for n in faults[name])
        )
    print(
        "StreamRedactor.feed alone over the same 64 KiB chunks (read from memory): MB/s per "
        "round "
        + " / ".join(f"{len(source) / t / 1e6:,.0f}" for t in feed_times["feed"])
        + f"; {feed_s / chunks * 1e6:.1f} µs per chunk beyond the read"
    )
    header = (
        "mode",
        "plain MB/s (no credentials)",
        f"**redact MB/s** (≥ {GOAL_MB_PER_SECOND:g})",
        f"redact / plain time (≤ {GOAL_RATIO:g}×)",
        "per-round ratios",
        "CPU-time ratio",
        "added µs per 64 KiB chunk",
        "of which StreamRedactor.feed alone",
    )
    rate = "met" if mbps >= GOAL_MB_PER_SECOND else "not met"
    cost = "met" if redact_s / plain_s <= GOAL_RATIO else "not met"
    row = (
        "daemon path",
        f"{len(source) / plain_s / 1e6:,.0f}",
        f"{mbps:,.0f} ({rate})",
        f"{redact_s / plain_s:.2f}× ({cost})",
        " / ".join(f"{r:.2f}" for r in ratios),
        f"{cpu_ratio:.2f}×",
        f"{(redact_s - plain_s) / chunks * 1e6:.1f}",
        f"{feed_s / chunks * 1e6:.1f}",
    )
    print()
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    print("| " + " | ".join(row) + " |")
    return 0


def run(args: argparse.Namespace) -> int:
    return run_daemon(args) if args.mode == "daemon" else run_stream(args)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.redaction",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--mode",
        default="stream",
        choices=["stream", "daemon"],
        help="stream: StreamRedactor vs a copy loop; daemon: Daemon.next_output_message()",
    )
    parser.add_argument("--megabytes", type=float, default=200.0, help="stream size (10^6 B)")
    parser.add_argument("--credentials", type=int, default=20, help="registered values (≥ 1)")
    parser.add_argument(
        "--pem-keys", type=int, default=1, help="how many of them are multi-line PEM keys"
    )
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per sink")
    parser.add_argument(
        "--chunk-kib",
        type=float,
        default=64.0,
        help="read size (stream mode), spool record size (daemon mode)",
    )
    parser.add_argument("--sinks", default="devnull,memory,file", help="devnull, memory, file")
    parser.add_argument("--engine", default="auto", choices=["auto", "hyperscan", "python"])
    parser.add_argument("--seed", type=int, default=20261130)
    parser.add_argument(
        "--min-literals",
        type=int,
        default=None,
        help="override endpointd.secrets.redact.MIN_LITERALS (0: no filler literals)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="daemon mode: cProfile one drain of each"
    )
    parser.add_argument("--profile-top", type=int, default=15, help="entries per profile")
    args = parser.parse_args(argv)
    args.sinks = [s.strip() for s in args.sinks.split(",") if s.strip()]
    if not args.sinks or set(args.sinks) - {"devnull", "memory", "file"}:
        parser.error("--sinks takes a comma-separated subset of devnull, memory, file")
    if not 0 <= args.pem_keys <= args.credentials or args.credentials < 1:
        parser.error("--credentials must be at least 1 and --pem-keys at most that")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
