"""An in-process device gateway on the test database, and a minimal protocol client.

The client is deliberately small and explicit (it is the test's eyes on the wire); the real
daemon is exercised by the endpointd tests.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import asyncpg
import grpc
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.db.pool import create_pool
from controlplane.db.urls import asyncpg_dsn
from controlplane.gateway import pairing
from controlplane.gateway.delivery import CommandDelivery
from controlplane.gateway.hub import DeviceHub
from controlplane.gateway.queue import CommandQueue
from controlplane.gateway.server import EndpointGateway, GatewayService
from controlplane.gateway.stream_caps import StreamCaps
from controlplane.gateway.tls import GATEWAY_NAME, ServerTls, ensure_server_tls
from controlplane.settings import GrpcSettings
from superagent_proto.v1 import endpoint_pb2 as pb
from superagent_proto.v1 import endpoint_pb2_grpc
from superagent_shared.protocol import hello_signing_payload
from tests.support.database import asyncpg_transaction


@dataclass
class Gateway:
    port: int
    queue: CommandQueue  # the workers' side of the gateway's queue
    tls: ServerTls
    pool: asyncpg.Pool  # the gateway's own
    hub: DeviceHub
    delivery: CommandDelivery  # the side the gateway's streams use
    streams: StreamCaps  # the streams it holds now (its slots)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def channel(self) -> grpc.aio.Channel:
        credentials = grpc.ssl_channel_credentials(root_certificates=self.tls.ca_pem)
        return grpc.aio.secure_channel(
            self.target, credentials, options=[("grpc.ssl_target_name_override", GATEWAY_NAME)]
        )

    async def pairing_code(self, name: str) -> str:
        return await pairing_code(self.pool, name)


async def pairing_code(
    db: async_sessionmaker[AsyncSession] | asyncpg.Pool, name: str, *, owner: str = "tester"
) -> str:
    """A code for a device ``owner`` will own (only they may direct work to it); ``db``:
    the ``db`` or ``pool`` fixture, or a gateway's pool."""
    async with asyncpg_transaction(db) as conn:
        issued = await pairing.create_code(conn, device_name=name, owner=owner, created_by="test")
    return issued.display


@contextlib.asynccontextmanager
async def running_gateway(
    database_url: str,
    db: async_sessionmaker[AsyncSession],
    state_dir: Path,
    *,
    heartbeat_seconds: float = 15.0,
    grpc_settings: Mapping[str, object] | None = None,
) -> AsyncIterator[Gateway]:
    """A gateway on an ephemeral port; ``grpc_settings`` sets other GrpcSettings fields.

    ``db``: the fixture that empties the database first (the gateway has a pool of its own).
    """
    dsn = asyncpg_dsn(database_url)
    pool = await create_pool(dsn, size=10)
    settings = GrpcSettings.model_validate(
        {"port": 0, "heartbeat_seconds": heartbeat_seconds, **(grpc_settings or {})}
    )
    tls = ensure_server_tls(state_dir / "tls")
    queue = CommandQueue(pool, ttl=timedelta(hours=1), inline=64)
    delivery = CommandDelivery(pool, inline=64)
    hub = DeviceHub(dsn, delivery, "test-replica")
    servicer = EndpointGateway(pool, delivery, hub, settings, tls, "test deployment")
    service = GatewayService(settings, servicer)
    await hub.start()
    await service.start()
    try:
        while service.port is None:  # noqa: ASYNC110 - the port appears once, right after bind
            await asyncio.sleep(0.01)
        yield Gateway(service.port, queue, tls, pool, hub, delivery, servicer.streams)
    finally:
        await service.stop(5)
        await hub.stop(5)
        await queue.close()
        await pool.close()


@pytest.fixture(name="gateway")
async def gateway_fixture(
    db: async_sessionmaker[AsyncSession], database_url: str, tmp_path: Path
) -> AsyncIterator[Gateway]:
    """A running gateway over the emptied test database (import the fixture to use it)."""
    async with running_gateway(database_url, db, tmp_path) as gw:
        yield gw


@dataclass
class FakeDevice:
    """Speaks the protocol by hand: pair, connect, and record what the server sends."""

    gateway: Gateway
    key: Ed25519PrivateKey = field(default_factory=Ed25519PrivateKey.generate)
    device_id: str = ""
    received: asyncio.Queue[pb.ServerMessage] = field(default_factory=asyncio.Queue)
    outgoing: asyncio.Queue[pb.DeviceMessage | None] = field(default_factory=asyncio.Queue)
    call: grpc.aio.StreamStreamCall | None = None
    _channel: grpc.aio.Channel | None = None
    _reader: asyncio.Task[None] | None = None
    status: grpc.StatusCode | None = None
    details: str = ""

    @property
    def public_key(self) -> bytes:
        return self.key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    async def pair(self, code: str) -> pb.PairResponse:
        async with self.gateway.channel() as channel:
            stub = endpoint_pb2_grpc.EndpointGatewayStub(channel)
            response: pb.PairResponse = await stub.Pair(
                pb.PairRequest(
                    pairing_code=code,
                    device_name="ignored",
                    public_key=self.public_key,
                    daemon_version="test",
                    protocol_version=1,
                )
            )
        self.device_id = response.device_id
        return response

    async def connect(
        self,
        in_flight: list[pb.InFlight] | None = None,
        *,
        sign_with: Ed25519PrivateKey | None = None,
    ) -> None:
        self._channel = self.gateway.channel()
        stub = endpoint_pb2_grpc.EndpointGatewayStub(self._channel)
        self.received = asyncio.Queue()
        self.outgoing = asyncio.Queue()
        self.status, self.details = None, ""

        async def requests() -> AsyncIterator[pb.DeviceMessage]:
            while True:
                message = await self.outgoing.get()
                if message is None:
                    return
                yield message

        self.call = stub.Connect(requests())
        challenge = await self.call.read()
        assert isinstance(challenge, pb.ServerMessage)
        nonce = challenge.challenge.nonce
        signature = (sign_with or self.key).sign(
            hello_signing_payload(
                nonce=nonce,
                device_id=self.device_id,
                daemon_version="test",
                protocol_version=1,
                policy_hash=b"\x01" * 32,
            )
        )
        await self.outgoing.put(
            pb.DeviceMessage(
                hello=pb.Hello(
                    device_id=self.device_id,
                    daemon_version="test",
                    protocol_version=1,
                    signature=signature,
                    in_flight=in_flight or [],
                    policy_hash=b"\x01" * 32,
                )
            )
        )
        self._reader = asyncio.create_task(self._read(self.call, self.received))

    async def _read(
        self, call: grpc.aio.StreamStreamCall, received: asyncio.Queue[pb.ServerMessage]
    ) -> None:
        """Read ``call`` into ``received``; its status becomes :attr:`status` only while it
        is still this device's current call (a connection's end never reads as the next's)."""
        code, details = grpc.StatusCode.OK, ""
        try:
            # read() rather than `async for`: the challenge was already taken with read(),
            # and gRPC forbids mixing the two styles on one call.
            while (message := await call.read()) is not grpc.aio.EOF:
                assert isinstance(message, pb.ServerMessage)
                await received.put(message)
        except grpc.aio.AioRpcError as err:
            code, details = err.code(), err.details() or ""
        if call is self.call:
            self.status, self.details = code, details

    async def next(self, kind: str, timeout: float = 10) -> pb.ServerMessage:
        """The next server message of ``kind`` (heartbeats are skipped unless asked for)."""
        while True:
            message = await asyncio.wait_for(self.received.get(), timeout)
            if message.WhichOneof("msg") == kind:
                return message

    async def send(self, **message: object) -> None:
        await self.outgoing.put(pb.DeviceMessage(**message))  # type: ignore[arg-type]

    async def ended(self, timeout: float = 10) -> grpc.StatusCode:
        assert self._reader is not None
        await asyncio.wait_for(asyncio.shield(self._reader), timeout)
        assert self.status is not None
        return self.status

    async def close(self) -> None:
        if self.call is not None:
            self.call.cancel()
        if self._reader is not None:
            with contextlib.suppress(BaseException):
                await self._reader
        if self._channel is not None:
            await self._channel.close()


async def paired(gateway: Gateway, name: str = "laptop") -> FakeDevice:
    """A device paired with ``gateway`` (its pairing answer checked), not yet connected."""
    device = FakeDevice(gateway)
    response = await device.pair(await gateway.pairing_code(name))
    assert response.server_cert_sha256 == gateway.tls.leaf_sha256
    assert response.server_ca_pem == gateway.tls.ca_pem.decode()
    assert response.device_id.startswith("dev_")
    return device


@contextlib.asynccontextmanager
async def connected(gateway: Gateway, name: str = "laptop") -> AsyncIterator[FakeDevice]:
    """A paired device with an open stream, closed afterwards."""
    device = await paired(gateway, name)
    await device.connect()
    try:
        yield device
    finally:
        await device.close()
