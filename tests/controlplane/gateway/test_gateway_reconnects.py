"""A device's newer connection replaces its older one, whatever order the notices arrive in.

Each stream announces "connected" to every replica (the hub's LISTEN channel) so that a
replica still holding an older stream of the device closes it. Notices travel through
Postgres and can arrive late: after the device has closed that stream and opened the next
one. A late notice must never close a newer stream, on the replica that sent it or on
another one. (Seen as `test_random_device_messages_never_break_the_gateway` getting
ABORTED "replaced by a newer connection" under load.)

Likewise a device that goes away while the gateway writes to it: the write fails before
the call's cancellation reaches the stream, and that is the device's close, not a gateway
error (seen in the same test as "stream of dev_… failed: ExecuteBatchError").
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, cast

import asyncpg
import grpc
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.db.urls import asyncpg_dsn
from controlplane.domain import Notify
from controlplane.gateway.hub import DeviceHub
from controlplane.gateway.stream import DeviceStream
from superagent_proto.v1 import endpoint_pb2 as pb
from tests.support.gateway_harness import FakeDevice, Gateway, paired, running_gateway
from tests.support.helpers import assert_eventually


async def _registered(gateway: Gateway, device: FakeDevice, *, not_: str = "") -> DeviceStream:
    """The hub's stream of ``device`` once registered (and other than stream ``not_``)."""

    def current() -> DeviceStream | None:
        stream = gateway.hub.streams.get(device.device_id)
        return stream if stream is not None and stream.stream_id != not_ else None

    stream: DeviceStream = await assert_eventually(current, message="stream registered")
    return stream


async def _still_served(device: FakeDevice, stream: DeviceStream, gateway: Gateway) -> None:
    assert stream.close_reason is None, stream.close_reason
    assert gateway.hub.streams.get(device.device_id) is stream
    await device.send(heartbeat=pb.Heartbeat(seq=7))
    assert (await device.next("heartbeat")).heartbeat is not None
    assert device.status is None, (device.status, device.details)


async def test_a_late_notice_of_a_closed_connection_leaves_the_newer_one_open(
    db: async_sessionmaker[AsyncSession],
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The hub's device notices are held back here and delivered when the test says: the
    # notice of the first connection arrives only after the second one is registered.
    held: list[str] = []
    deliver = DeviceHub._on_devices
    monkeypatch.setattr(DeviceHub, "_on_devices", lambda _hub, payload: held.append(payload))
    async with running_gateway(database_url, db, tmp_path) as gateway:
        device = await paired(gateway, "laptop")
        await device.connect()
        first = await _registered(gateway, device)
        await assert_eventually(lambda: len(held) == 1, message="the first notice")
        await device.close()
        await assert_eventually(
            lambda: device.device_id not in gateway.hub.streams, message="first stream gone"
        )
        await device.connect()
        try:
            second = await _registered(gateway, device, not_=first.stream_id)
            await assert_eventually(lambda: len(held) == 2, message="the second notice")
            for payload in held:  # late, in the order they were sent
                deliver(gateway.hub, payload)
            await _still_served(device, second, gateway)
        finally:
            await device.close()


async def _notify(database_url: str, *payloads: str) -> None:
    """Send ``payloads`` in order, as another replica would (they arrive in that order)."""
    conn = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        for payload in payloads:
            await conn.execute("SELECT pg_notify($1, $2)", Notify.DEVICES, payload)
    finally:
        await conn.close()


def _connected_notice(device_id: str, stream_id: str, connected_at_us: int) -> str:
    return f"connected:{device_id}:{stream_id}:{connected_at_us}"


async def test_another_replicas_notice_closes_only_an_older_stream(
    db: async_sessionmaker[AsyncSession], database_url: str, tmp_path: Path
) -> None:
    async with running_gateway(database_url, db, tmp_path) as gateway:
        device = await paired(gateway, "laptop")
        marker = await paired(gateway, "marker")
        await device.connect()
        await marker.connect()
        try:
            stream = await _registered(gateway, device)
            await _registered(gateway, marker)
            connected_at_us = await gateway.pool.fetchval(
                "SELECT (extract(epoch FROM connected_at) * 1000000)::bigint FROM devices "
                "WHERE id = $1",
                device.device_id,
            )
            # A connection elsewhere that came before this one (its notice is late): ignored.
            # The marker's notice after it shows when the hub has taken both.
            older = _connected_notice(device.device_id, "elsewhere1", connected_at_us - 1)
            await _notify(database_url, older, f"revoked:{marker.device_id}")
            assert await marker.ended() == grpc.StatusCode.PERMISSION_DENIED
            await _still_served(device, stream, gateway)
            # One after it: the device is connected elsewhere now, so this stream ends.
            newer = _connected_notice(device.device_id, "elsewhere2", connected_at_us + 1)
            await _notify(database_url, newer)
            assert await device.ended() == grpc.StatusCode.ABORTED
            assert "replaced by a newer connection" in device.details
        finally:
            await device.close()
            await marker.close()


class _GoneOnWrite:
    """The stream's gRPC context, whose writes fail as they do once the device has cancelled
    the call but that cancellation has not reached the stream yet."""

    def __init__(self, context: Any) -> None:
        self._context = context

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    async def write(self, message: object) -> None:
        raise grpc.aio.InternalError('Failed "execute_batch"')  # as grpc says it


async def test_a_write_to_a_device_that_went_away_is_its_close_not_a_gateway_error(
    db: async_sessionmaker[AsyncSession],
    database_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="controlplane.gateway")
    async with running_gateway(database_url, db, tmp_path) as gateway:
        device = await paired(gateway, "laptop")
        await device.connect()
        try:
            stream = await _registered(gateway, device)
            stream.context = cast("grpc.aio.ServicerContext", _GoneOnWrite(stream.context))
            await device.send(heartbeat=pb.Heartbeat(seq=1))  # answered: a write
            await assert_eventually(
                lambda: device.device_id not in gateway.hub.streams, message="stream ended"
            )
        finally:
            await device.close()
    assert stream.close_reason is not None
    assert stream.close_reason.code == grpc.StatusCode.CANCELLED, stream.close_reason
    failed = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert not failed, failed
