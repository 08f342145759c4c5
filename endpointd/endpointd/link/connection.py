"""The Connect stream, client side: handshake, heartbeats, liveness, reconnects.

One stream per device at a time. Each session:

1. opens a fresh channel (pinned CA, system roots, or loopback plaintext) with HTTP/2
   keepalive, and calls Connect;
2. waits for the server's Challenge, records the clock offset and heartbeat interval, and
   answers with a signed Hello listing every journaled command not yet acknowledged;
3. runs four tasks until one fails: the reader (commands and acks into the daemon), the
   writer (the only task that writes to the stream: control messages first, then output and
   results from the spools), the heartbeat (sends one per interval and declares the
   stream dead once three intervals have passed with nothing received), and the
   repositories (the clones under the allowed roots and the coding-agent CLIs installed
   here: a RepositoryReport right after the Hello, and again whenever either changes).

:func:`connect_forever` repeats sessions with capped, jittered backoff; the backoff resets
once a session proves healthy (a server message after the Hello), so a rejected device
(UNAUTHENTICATED / PERMISSION_DENIED right after its Hello) backs off to the cap instead of
hammering the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, NoReturn

import grpc

from endpointd import __version__, wire
from endpointd.commands.daemon import Daemon
from endpointd.guard import sandbox
from endpointd.harness.detect import Harnesses
from endpointd.keys import DeviceKey
from endpointd.link.trust import channel_credentials, channel_options, parse_server_url
from superagent_shared.backoff import Backoff
from superagent_shared.messages import Challenge, Harness, Heartbeat, Repository
from superagent_shared.protocol import (
    MAX_DEVICE_RECEIVE_BYTES,
    PROTOCOL_MAX_VERSION,
    PROTOCOL_MIN_VERSION,
    Speaker,
    hello_signing_payload,
    incompatibility,
    negotiate,
)

log = logging.getLogger(__name__)

DEFAULT_HEARTBEAT_SECONDS = 15
MISSED_HEARTBEATS = 3
HANDSHAKE_TIMEOUT_SECONDS = 30.0
# A session that stayed up this long counts as healthy even if the server never spoke.
HEALTHY_AFTER_SECONDS = 30.0
# How often the allowed roots are looked at for a change (a rescan follows one, and the
# scan itself is redone when it is RESCAN_SECONDS old: see endpointd.workspaces.discovery).
REPOSITORIES_CHECK_SECONDS = 5.0
# Room for a 4 MiB WriteFile plus envelope; gRPC's default limit is exactly 4 MiB.
MAX_RECEIVE_BYTES = MAX_DEVICE_RECEIVE_BYTES

KEEPALIVE_OPTIONS: list[tuple[str, Any]] = [
    # HTTP/2 pings notice a dead TCP path (NAT timeout, laptop sleep) without app traffic.
    # The server must allow pings this often (grpc.http2.min_ping_interval_without_data_ms
    # <= 20 s), or it answers with GOAWAY "too_many_pings".
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
    # Reconnecting is this module's job, with its own backoff; no hidden retries below it.
    ("grpc.enable_retries", 0),
    # No BDP probes: gRPC answers data received after a quiet spell with a PING to size its
    # flow-control window, i.e. one more round trip for the gateway on every heartbeat of
    # every device. A fixed 4 MiB window instead (what probing reaches on a fast link).
    ("grpc.http2.bdp_probe", 0),
    ("grpc.http2.lookahead_bytes", 4 << 20),
]

REJECTED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


class SessionEnded(Exception):
    """A session ended for a reason worth logging; ``code`` is the gRPC status, if any."""

    def __init__(self, message: str, *, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code


class Incompatible(SessionEnded):
    """The server speaks no protocol version this daemon does; the message is the one line
    naming both versions and what to upgrade. Retried with backoff (the server may be
    upgraded meanwhile), and logged once per distinct line."""


# This release and the protocol versions it speaks.
SPEAKS = Speaker(__version__, PROTOCOL_MIN_VERSION, PROTOCOL_MAX_VERSION)


class Session:
    def __init__(self, daemon: Daemon, key: DeviceKey, harnesses: Harnesses | None = None) -> None:
        self.daemon = daemon
        self.key = key
        # Shared across sessions (connect_forever), so a reconnect does not run every
        # harness's --version again.
        self.harnesses = harnesses if harnesses is not None else Harnesses()
        self.established = False
        self.opened_at = time.monotonic()
        self.last_received = time.monotonic()
        self.peer_heartbeat_seq = 0
        self.control: asyncio.Queue[wire.Outgoing] = asyncio.Queue()
        self.on_established: asyncio.Event = asyncio.Event()

    def _channel(self) -> grpc.aio.Channel:
        config = self.daemon.config
        addr = parse_server_url(config.server_url)
        creds = channel_credentials(config.trust)
        options = KEEPALIVE_OPTIONS + channel_options(config.trust)
        if creds is None:
            return grpc.aio.insecure_channel(addr.target, options=options)
        return grpc.aio.secure_channel(addr.target, creds, options=options)

    def _hello(self, challenge: Challenge, version: int) -> wire.Outgoing:
        config = self.daemon.config
        policy_hash = self.daemon.policy.hash()
        payload = hello_signing_payload(
            nonce=challenge.nonce,
            device_id=config.device_id,
            daemon_version=SPEAKS.release,
            protocol_version=version,
            policy_hash=policy_hash,
        )
        return wire.hello(
            device_id=config.device_id,
            daemon_version=SPEAKS.release,
            protocol_version=version,
            min_protocol_version=SPEAKS.low,
            max_protocol_version=SPEAKS.high,
            signature=self.key.sign(payload),
            in_flight=self.daemon.in_flight(),
            policy_hash=policy_hash,
            # Unsigned and informational (the signed policy_hash covers the mode).
            sandbox=self.daemon.policy.sandbox_summary,
        )

    async def run(self, stopping: asyncio.Event) -> None:
        async with self._channel() as channel:
            stream = wire.open_stream(channel)
            try:
                await self._run_stream(stream, stopping)
            finally:
                stream.cancel()
                self.daemon.on_disconnected()

    async def _run_stream(self, stream: wire.Stream, stopping: asyncio.Event) -> None:
        first = await asyncio.wait_for(stream.read(), HANDSHAKE_TIMEOUT_SECONDS)
        if first is None:
            raise SessionEnded("the server closed the stream before its Challenge")
        if not isinstance(first, Challenge):
            raise SessionEnded(f"protocol error: first server message is {wire.kind_of(first)}")
        challenge = first
        # A server older than the range fields speaks its protocol_version alone.
        server = Speaker.stated(
            challenge.server_version,
            challenge.protocol_version,
            challenge.max_protocol_version or challenge.protocol_version,
        )
        version = negotiate(SPEAKS, server)
        if version is None:
            await self._refuse(stream, challenge, server)
        if challenge.server_time is not None:
            self.daemon.set_clock(challenge.server_time)
        interval = challenge.heartbeat_interval_seconds or DEFAULT_HEARTBEAT_SECONDS
        self.last_received = time.monotonic()
        await stream.write(self._hello(challenge, version))
        self.daemon.on_connected(self.control)
        self.daemon.status.update(
            state="connected",
            connected_at=wire.time_text(),
            heartbeat_seconds=interval,
            sandbox=self.daemon.policy.sandbox_summary,
        )
        log.info(
            "connected to %s as %s", self.daemon.config.server_url, self.daemon.config.device_id
        )

        tasks = [
            asyncio.create_task(self._reader(stream), name="endpointd-reader"),
            asyncio.create_task(self._writer(stream), name="endpointd-writer"),
            asyncio.create_task(self._heartbeat(interval), name="endpointd-heartbeat"),
            asyncio.create_task(self._repositories(), name="endpointd-repositories"),
            asyncio.create_task(stopping.wait(), name="endpointd-stopping"),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

    async def _refuse(self, stream: wire.Stream, challenge: Challenge, server: Speaker) -> NoReturn:
        """End a session with a server that shares no protocol version with this daemon.

        The Hello is still sent, naming our newest version and our range: a server that
        understands ranges then refuses us with the same line and logs which device it
        turned away, so its admin sees it too. Its refusal (or any end) is awaited, so the
        Hello is not cancelled in flight (bounded: a server that does not end the stream is
        left after HANDSHAKE_TIMEOUT_SECONDS).
        """
        line = incompatibility(SPEAKS, server) or "no common protocol version"
        await stream.write(self._hello(challenge, SPEAKS.high))

        async def until_ended() -> None:
            while await stream.read() is not None:
                pass

        with contextlib.suppress(Exception):
            await asyncio.wait_for(until_ended(), HANDSHAKE_TIMEOUT_SECONDS)
        raise Incompatible(line, code=grpc.StatusCode.FAILED_PRECONDITION)

    def _mark_healthy(self) -> None:
        if not self.established:
            self.established = True
            self.on_established.set()

    async def _reader(self, stream: wire.Stream) -> None:
        while True:
            message = await stream.read()
            if message is None:
                code = await stream.code()
                details = await stream.details()
                raise SessionEnded(
                    f"the server ended the stream ({code.name}: {details or 'no detail'})",
                    code=code,
                )
            self.last_received = time.monotonic()
            self._mark_healthy()
            if isinstance(message, Heartbeat):
                self.peer_heartbeat_seq = max(self.peer_heartbeat_seq, message.seq)
                continue
            try:
                self.daemon.handle_server_message(message)
            except Exception:
                # It answers each command itself; a failure left over is logged, never the
                # stream's end (the server would deliver the same message on the next one).
                log.exception("handling a %s failed", wire.kind_of(message))

    async def _writer(self, stream: wire.Stream) -> None:
        daemon = self.daemon
        while True:
            # Cleared BEFORE draining: anything that becomes sendable meanwhile sets it
            # again, so the wait below can never sleep through pending work.
            daemon.wake.clear()
            while True:
                if not self.control.empty():
                    await stream.write(self.control.get_nowait())
                    continue
                message = daemon.next_output_message()
                if message is None:
                    break
                await stream.write(message)
            await daemon.wake.wait()

    async def _heartbeat(self, interval: int) -> None:
        seq = 0
        limit = MISSED_HEARTBEATS * interval
        next_beat = time.monotonic() + interval
        while True:
            # Awake for the next heartbeat, and at the moment the silence limit is reached:
            # the gateway answers each heartbeat, i.e. speaks just after our own ticks, so a
            # check made only at those ticks would notice its death almost an interval late.
            wake_at = min(next_beat, self.last_received + limit)
            await asyncio.sleep(max(0.0, wake_at - time.monotonic()))
            now = time.monotonic()
            if now - self.last_received >= limit:
                raise SessionEnded(
                    f"nothing received from the server for {limit} s;"
                    " treating the connection as dead"
                )
            if now < next_beat:
                continue  # heard from the server meanwhile
            next_beat = now + interval
            if now - self.opened_at >= HEALTHY_AFTER_SECONDS:
                self._mark_healthy()
            seq += 1
            self.control.put_nowait(wire.heartbeat(seq, ack_seq=self.peer_heartbeat_seq))
            self.daemon.wake.set()
            # The sandbox line follows policy edits made while connected.
            self.daemon.status.update(
                last_heartbeat_at=wire.time_text(),
                sandbox=self.daemon.policy.sandbox_summary,
            )

    def _harnesses_now(self) -> tuple[tuple[Harness, ...], str]:
        """The harnesses found here and the policy's default (in a thread: a new or
        changed executable runs its --version)."""
        daemon = self.daemon
        stored: list[str] = []
        if daemon.credentials is not None:
            try:
                stored = daemon.credentials.names()
            except Exception as exc:  # an unreadable index: no credential counts as a login
                log.warning("cannot list the stored credentials: %s", exc)
        rules = daemon.policy.rules
        found = self.harnesses.current(rules, stored=stored, home=daemon.policy.home)
        default = rules.harness.default if rules is not None else ""
        return tuple(f.report() for f in found if f.program is not None), default

    async def _repositories(self) -> None:
        """Report the clones under the allowed roots and the harnesses installed here after
        the Hello, and again whenever they change (the harnesses are looked at on the same
        schedule, so a policy edit or a new install shows within seconds). Informational:
        a scan that fails is logged and tried again, never the stream's end (a server that
        predates the report ignores it)."""
        daemon = self.daemon
        sent: tuple[tuple[Repository, ...], bool, tuple[Harness, ...], str] | None = None
        while True:
            try:
                found = await asyncio.to_thread(daemon.workspaces.scan, daemon.policy)
                harnesses, default = await asyncio.to_thread(self._harnesses_now)
                report = (
                    tuple(
                        Repository(c.path, c.remote, c.default_branch) for c in found.repositories
                    ),
                    found.truncated,
                    harnesses,
                    default,
                )
                message = (
                    wire.repositories(
                        report[0],
                        truncated=report[1],
                        scanned_at=found.scanned_at,
                        harnesses=harnesses,
                        default_harness=default,
                    )
                    if report != sent
                    else None
                )
            except Exception:
                log.exception("scanning the allowed roots for repositories failed")
            else:
                if message is not None:
                    self.control.put_nowait(message)
                    daemon.wake.set()
                    sent = report
                    log.info(
                        "reported %d repositories%s and harnesses [%s]",
                        len(report[0]),
                        " (the scan stopped at its bounds)" if report[1] else "",
                        ", ".join(h.name for h in harnesses),
                    )
            await asyncio.sleep(REPOSITORIES_CHECK_SECONDS)


def describe(exc: BaseException) -> tuple[str, grpc.StatusCode | None]:
    if isinstance(exc, SessionEnded):
        return str(exc), exc.code
    if isinstance(exc, grpc.aio.AioRpcError):
        code = exc.code()
        return f"{code.name}: {exc.details() or 'no detail'}", code
    if isinstance(exc, TimeoutError):
        return "timed out waiting for the server's Challenge", None
    return f"{type(exc).__name__}: {exc}", None


async def connect_forever(daemon: Daemon, key: DeviceKey, stopping: asyncio.Event) -> None:
    backoff = Backoff()
    # Probe the OS sandbox once, off the event loop (it may start a short-lived process):
    # every Hello and status update describes it.
    await asyncio.to_thread(sandbox.support)
    told = ""  # the last version line logged: said once, not on every retry
    harnesses = Harnesses()
    while not stopping.is_set():
        daemon.status.update(
            state="connecting",
            server=daemon.config.server_url,
            sandbox=daemon.policy.sandbox_summary,
        )
        session = Session(daemon, key, harnesses)
        reset_on_health = asyncio.create_task(session.on_established.wait())
        reset_on_health.add_done_callback(lambda t: None if t.cancelled() else backoff.reset())
        failure: Exception | None = None
        try:
            await session.run(stopping)
            message, code = "disconnected", None
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            failure = exc
            message, code = describe(exc)
        finally:
            reset_on_health.cancel()
        if stopping.is_set():
            break
        if isinstance(failure, Incompatible):
            if message != told:
                log.error("%s (retrying with backoff in case the other side is upgraded)", message)
                told = message
            else:
                log.debug("still incompatible: %s", message)
        elif code in REJECTED:
            log.error(
                "the server rejected this device (%s); it may have been revoked or removed —"
                " run `endpointd unpair` and pair again if so. Retrying with backoff.",
                message,
            )
        else:
            log.warning("connection to %s lost: %s", daemon.config.server_url, message)
        delay = backoff.next_delay()
        daemon.status.update(
            state="disconnected",
            last_error=message,
            last_error_code=code.name if code is not None else None,
            last_error_at=wire.time_text(),
            retry_in_seconds=round(delay, 1),
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), timeout=delay)
