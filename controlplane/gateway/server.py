"""The gRPC server of the device gateway: Pair and Connect, over TLS by default.

Transport only: each RPC hands plain data (:mod:`.messages`, converted from protobuf by
``wire.Servicer``, this class's base) to the domain (``pairing``, ``stream``) and maps domain
errors to gRPC status codes in one function.
"""

from __future__ import annotations

import logging
import random
import socket
import urllib.parse
from collections.abc import Coroutine
from typing import ClassVar

import asyncpg
import grpc

import controlplane
from controlplane import listening
from controlplane.errors import SuperagentError
from controlplane.gateway import pairing, wire
from controlplane.gateway.delivery import CommandDelivery
from controlplane.gateway.hub import DeviceHub
from controlplane.gateway.stream import DeviceStream
from controlplane.gateway.stream_caps import StreamCaps
from controlplane.gateway.tls import ServerTls
from controlplane.peers import peer_group
from controlplane.services import Service
from controlplane.settings import GrpcSettings
from superagent_shared.messages import PairRequest, PairResponse
from superagent_shared.protocol import (
    PROTOCOL_MAX_VERSION,
    PROTOCOL_MIN_VERSION,
    Speaker,
    incompatibility,
)

log = logging.getLogger(__name__)

_PAIRING_STATUS = {
    "throttled": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "invalid_key": grpc.StatusCode.INVALID_ARGUMENT,
    "invalid_code": grpc.StatusCode.INVALID_ARGUMENT,
    "invalid_name": grpc.StatusCode.INVALID_ARGUMENT,
    "name_taken": grpc.StatusCode.ALREADY_EXISTS,
}


def status_for(exc: SuperagentError) -> grpc.StatusCode:
    """The one mapping from domain errors to gRPC status codes."""
    if isinstance(exc, pairing.PairingRefused):
        return _PAIRING_STATUS.get(exc.reason, grpc.StatusCode.PERMISSION_DENIED)
    return {
        400: grpc.StatusCode.INVALID_ARGUMENT,
        401: grpc.StatusCode.UNAUTHENTICATED,
        403: grpc.StatusCode.PERMISSION_DENIED,
        404: grpc.StatusCode.NOT_FOUND,
        409: grpc.StatusCode.ALREADY_EXISTS,
        503: grpc.StatusCode.UNAVAILABLE,
    }.get(exc.http_status, grpc.StatusCode.INTERNAL)


def peer_address(context: grpc.aio.ServicerContext) -> str:
    """The client's IP from gRPC's peer string (``ipv4:1.2.3.4:5678``, ``ipv6:[::1]:5678``).

    gRPC escapes the brackets (``ipv6:%5B::1%5D:5678``): unescaped first, or every IPv6
    connection, with its own port, would look like a new client.
    """
    peer = urllib.parse.unquote(context.peer() or "unknown")
    kind, _, rest = peer.partition(":")
    if kind == "ipv6" and rest.startswith("["):
        return rest[1 : rest.index("]")]
    if kind == "ipv4":
        return rest.rsplit(":", 1)[0]
    return peer


class EndpointGateway(wire.Servicer):
    # This release and the protocol versions it speaks, stated to every daemon.
    speaks: ClassVar[Speaker] = Speaker(
        controlplane.__version__, PROTOCOL_MIN_VERSION, PROTOCOL_MAX_VERSION
    )

    def __init__(
        self,
        pool: asyncpg.Pool,
        delivery: CommandDelivery,
        hub: DeviceHub,
        settings: GrpcSettings,
        tls: ServerTls | None,
        server_name: str,
    ) -> None:
        self.pool = pool
        self.delivery = delivery
        self.hub = hub
        self.settings = settings
        self.tls = tls
        self.server_name = server_name
        self.streams = StreamCaps(settings.max_streams, settings.max_streams_per_peer)
        self.pairing_limits = pairing.Limits(
            per_peer=settings.pairing_failures_per_peer, everyone=settings.pairing_failures_global
        )

    async def pair(self, request: PairRequest, context: grpc.aio.ServicerContext) -> PairResponse:
        # protocol_version is the lowest the daemon speaks (0: a daemon too old to say).
        daemon = Speaker.stated(
            # Device-supplied text, echoed and logged: printable characters only.
            "".join(ch for ch in request.daemon_version[:100] if ch.isprintable()),
            request.protocol_version,
            request.max_protocol_version or request.protocol_version,
        )
        refusal = incompatibility(daemon, self.speaks)
        if refusal is not None:
            log.warning("pairing refused from %s: %s", peer_address(context), refusal)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, refusal)
        try:
            async with self.pool.acquire() as conn:
                # Counted (and committed) first: a refusal below rolls back only its own
                # transaction, and a burst cannot all be compared before any is counted.
                async with conn.transaction():
                    attempt = await pairing.count_attempt(
                        conn,
                        code=request.pairing_code,
                        public_key=request.public_key,
                        source=peer_address(context),
                        limits=self.pairing_limits,
                    )
                try:
                    async with conn.transaction():
                        device = await pairing.redeem(
                            conn,
                            attempt,
                            public_key=request.public_key,
                            version=request.daemon_version,
                            labels={"platform": request.platform, "hostname": request.hostname},
                            requested_name=request.device_name,
                        )
                except pairing.PairingRefused as refused:
                    if not refused.counts:  # not a failed guess: take its count back
                        async with conn.transaction():
                            await pairing.uncount(conn, attempt)
                    raise
        except SuperagentError as exc:
            log.info("pairing refused from %s: %s", peer_address(context), exc.message)
            await context.abort(status_for(exc), exc.message)
        except Exception:
            # Details go to the log; the device gets no internals.
            log.exception("pairing failed")
            await context.abort(grpc.StatusCode.INTERNAL, "internal error; see the gateway log")
        log.info("paired device %s (%s)", device.id, device.name)
        return PairResponse(
            device_id=device.id,
            server_cert_sha256=self.tls.leaf_sha256 if self.tls else b"",
            server_name=self.server_name,
            server_ca_pem=self.tls.ca_pem.decode() if self.tls else "",
            server_version=self.speaks.release,
        )

    def connect(self, context: grpc.aio.ServicerContext) -> Coroutine[object, object, None]:
        peer = peer_group(peer_address(context))
        refusal = self.streams.admit(peer)
        if refusal is not None:
            log.info("device stream refused from %s: %s", peer, refusal)
            refused: Coroutine[object, object, None] = context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED, refusal
            )
            return refused
        # Given back when the RPC ends, however it ends (no frame more per stream).
        context.add_done_callback(lambda _: self.streams.release(peer))
        stream = DeviceStream(
            self.hub, self.delivery, context, heartbeat_seconds=self.settings.heartbeat_seconds
        )
        return stream.run(self.speaks)  # not awaited here: a frame less per stream (wire.Servicer)


class GatewayService(Service):
    name = "grpc"

    def __init__(
        self,
        settings: GrpcSettings,
        gateway: EndpointGateway,
    ) -> None:
        super().__init__()
        self.settings = settings
        self.gateway = gateway
        self.port: int | None = None

    def _options(self) -> list[tuple[str, int]]:
        age_ms = int(self.settings.max_connection_age_seconds * 1000 * random.uniform(0.9, 1.1))  # noqa: S311
        heartbeat_ms = int(self.settings.heartbeat_seconds * 1000)
        return [
            # Proxies drop idle HTTP/2 connections; pings keep them open and detect dead
            # peers. Streams carry app-level heartbeats too, since proxies do not forward pings.
            ("grpc.keepalive_time_ms", max(heartbeat_ms * 2, 10_000)),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
            # endpointd pings every 20 s; never answer a ping with a too_many_pings GOAWAY.
            ("grpc.http2.max_ping_strikes", 0),
            # Recycle long-lived connections (with jitter) so devices spread over replicas.
            ("grpc.max_connection_age_ms", age_ms),
            ("grpc.max_connection_age_grace_ms", 30_000),
            ("grpc.max_receive_message_length", 8 << 20),
            # No BDP probes: gRPC answers data received after a quiet spell with a PING to
            # size its flow-control window, i.e. a round trip more on every heartbeat of every
            # device (with endpointd's also off: 7.8 % -> 5.1 % of a core for 2,000 idle
            # devices, bench/RESULTS.md). A fixed 4 MiB window instead, about what probing
            # reaches on a fast link, so far-away devices are not held to 64 KiB per round trip.
            ("grpc.http2.bdp_probe", 0),
            ("grpc.http2.lookahead_bytes", 4 << 20),
            # TLS records we send of at most 4 KiB: each connection keeps a buffer of this
            # size to build them in (16 KiB by default). What the gateway sends is small
            # (commands, acks, heartbeats), and 4 KiB records cost under 1 % in framing;
            # what devices send is unaffected. 2.2 KiB less per connection (bench/RESULTS.md).
            ("grpc.tsi.max_frame_size", 4096),
        ]

    async def run(self) -> None:
        server = grpc.aio.server(options=self._options())
        wire.add_to_server(self.gateway, server)
        host = self.settings.host
        address = (
            f"[{host}]:{self.settings.port}" if ":" in host else f"{host}:{self.settings.port}"
        )
        tls = self.gateway.tls
        try:
            if tls is None:
                self.port = server.add_insecure_port(address)
            else:
                credentials = grpc.ssl_server_credentials([(tls.key_pem, tls.cert_pem)])
                self.port = server.add_secure_port(address, credentials)
        except RuntimeError:  # gRPC's "Failed to bind": it does not say why
            raise listening.cannot_listen(
                host,
                self.settings.port,
                what="the device gateway",
                setting="SUPERAGENT_GRPC__PORT or --grpc-port",
            ) from None
        await server.start()
        log.info(
            "device gateway listening on %s:%d (%s)",
            self.settings.host,
            self.port,
            "TLS " + tls.fingerprint if tls else "plaintext: TLS must be terminated in front",
        )
        try:
            await self.stopping.wait()
        finally:
            await server.stop(grace=1.0)


def default_public_url(settings: GrpcSettings) -> str:
    if settings.public_url:
        return settings.public_url
    host = settings.host if settings.host not in ("0.0.0.0", "::", "") else socket.getfqdn()  # noqa: S104
    scheme = "http" if settings.tls == "off" else "https"
    return f"{scheme}://{host}:{settings.port}"
