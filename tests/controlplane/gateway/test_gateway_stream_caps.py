"""Anyone who can reach the gateway's port can open Connect streams before proving who they
are: the gateway holds at most ``max_streams`` in all and ``max_streams_per_peer`` from one
address (an IPv6 /64), and refuses the next with RESOURCE_EXHAUSTED naming the setting.
A slot is free again as soon as its stream ends."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from superagent_proto.v1 import endpoint_pb2 as pb
from superagent_proto.v1 import endpoint_pb2_grpc
from tests.support.gateway_harness import Gateway, connected, running_gateway
from tests.support.helpers import assert_eventually


@contextlib.asynccontextmanager
async def _stream(gateway: Gateway) -> AsyncIterator[tuple[str, str]]:
    """A bare Connect stream (no Hello: what anyone can open) on a connection of its own;
    yields what its first answer was: ("challenge", "") or (status name, details)."""
    channel = gateway.channel()
    stub = endpoint_pb2_grpc.EndpointGatewayStub(channel)
    silent: asyncio.Queue[pb.DeviceMessage] = asyncio.Queue()

    async def requests() -> AsyncIterator[pb.DeviceMessage]:
        yield await silent.get()  # never: the stream stays open, saying nothing

    call = stub.Connect(requests())
    try:
        try:
            first = await asyncio.wait_for(call.read(), 10)
            assert isinstance(first, pb.ServerMessage)
            answer = (first.WhichOneof("msg") or "", "")
        except grpc.aio.AioRpcError as err:
            answer = (err.code().name, err.details() or "")
        yield answer
    finally:
        call.cancel()
        await channel.close()


async def _held(gateway: Gateway, stack: contextlib.AsyncExitStack, n: int) -> list[str]:
    return [(await stack.enter_async_context(_stream(gateway)))[0] for _ in range(n)]


@pytest.mark.parametrize(
    ("caps", "setting"),
    [
        ({"max_streams": 50, "max_streams_per_peer": 3}, "SUPERAGENT_GRPC__MAX_STREAMS_PER_PEER"),
        ({"max_streams": 3, "max_streams_per_peer": 50}, "SUPERAGENT_GRPC__MAX_STREAMS"),
    ],
)
async def test_streams_past_the_caps_are_refused_clearly_and_slots_come_back(
    db: async_sessionmaker[AsyncSession],
    database_url: str,
    tmp_path: Path,
    caps: dict[str, int],
    setting: str,
) -> None:
    async with running_gateway(database_url, db, tmp_path, grpc_settings=caps) as gateway:
        async with contextlib.AsyncExitStack() as stack:
            assert await _held(gateway, stack, 3) == ["challenge"] * 3
            async with _stream(gateway) as (code, details):
                assert code == "RESOURCE_EXHAUSTED", (code, details)
                assert setting + "=3" in details
        # All three ended: once the gateway has seen them end (a cancel reaches it a moment
        # later), their slots are free, and a real device connects and works.
        await assert_eventually(lambda: gateway.streams.open == 0, timeout=10)
        async with contextlib.AsyncExitStack() as stack:
            assert await _held(gateway, stack, 2) == ["challenge"] * 2
            async with connected(gateway) as device:
                await device.send(heartbeat=pb.Heartbeat(seq=1))
                assert (await device.next("heartbeat")).WhichOneof("msg") == "heartbeat"
