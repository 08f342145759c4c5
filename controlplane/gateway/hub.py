"""The replica's registry of device streams, and what wakes them.

One LISTEN connection per replica (never one per device) carries two channels: new
commands for a device (wake its stream) and device events (revoked: close its stream at
once; connected elsewhere: close the older stream here). Which stream is older is decided by
when each was marked connected, not by when its notice arrives: a notice can arrive after
the device has closed that stream and opened a newer one, here or on another replica.

A once-a-second poll covers lost notifications, and heartbeats' ``last_seen_at`` updates are
written in one batch every few seconds instead of once per heartbeat.

Liveness is swept here too, once a second over every stream, by a plain timer rather than a
timer per stream, and apart from the poll so that a slow database cannot delay it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import grpc

from controlplane.db.listen import Listener, listen
from controlplane.domain import Notify
from controlplane.gateway import devices as registry
from controlplane.gateway.delivery import CommandDelivery, announced_command
from controlplane.gateway.stream import DeviceStream
from controlplane.services import Service, critical_loop, sleep_unless

log = logging.getLogger(__name__)

POLL_SECONDS = 1.0
SWEEP_SECONDS = 1.0  # silence is noticed at most this long after its limit
WRITE_BATCH_SECONDS = 0.5  # see write_slot
TOUCH_FLUSH_SECONDS = 5.0


class DeviceHub(Service):
    name = "device-hub"

    def __init__(self, dsn: str, delivery: CommandDelivery, replica_id: str) -> None:
        super().__init__()
        self.dsn = dsn
        self.delivery = delivery
        self.replica_id = replica_id
        self.streams: dict[str, DeviceStream] = {}
        self._touched: set[str] = set()
        self._listener: Listener | None = None  # once run() listens
        self._sweeper: asyncio.TimerHandle | None = None
        self._write_slot: asyncio.Future[None] | None = None

    # -- streams -------------------------------------------------------------------------

    def register(self, stream: DeviceStream) -> None:
        older = self.streams.get(stream.device_id)
        if older is not None and older is not stream:
            older.close(grpc.StatusCode.ABORTED, "replaced by a newer connection")
        self.streams[stream.device_id] = stream
        # Other replicas close their stream of this device, if they still hold one.
        self._notify(f"connected:{stream.device_id}:{stream.stream_id}:{stream.connected_at_us}")

    async def unregister(self, stream: DeviceStream) -> None:
        """Forget ``stream``; also for one that ended mid-handshake, before :meth:`register`."""
        current = self.streams.get(stream.device_id)
        if current is not None and current is not stream:
            return  # a newer stream of the device is held here
        if current is stream:
            del self.streams[stream.device_id]
        with contextlib.suppress(Exception):
            await registry.disconnected(self.delivery.pool, stream.device_id, self.replica_id)

    def touch(self, device_id: str) -> None:
        self._touched.add(device_id)

    def _notify(self, payload: str) -> None:
        async def send() -> None:
            with contextlib.suppress(Exception):
                await self.delivery.pool.execute(
                    "SELECT pg_notify($1, $2)", Notify.DEVICES, payload
                )

        asyncio.get_running_loop().create_task(send())

    # -- notifications -------------------------------------------------------------------

    def _on_commands(self, payload: str) -> None:
        try:
            device_id, command = announced_command(payload)
        except (ValueError, KeyError, TypeError):
            log.warning("unreadable command notification: %.200r", payload)
            return  # the once-a-second poll finds the command anyway
        stream = self.streams.get(device_id)
        if stream is None:
            return
        if command is not None:
            stream.offer(command)
        else:
            stream.wake()

    def _on_devices(self, payload: str) -> None:
        event, _, rest = payload.partition(":")
        device_id, _, rest = rest.partition(":")
        stream = self.streams.get(device_id)
        if stream is None:
            return
        if event == "revoked":
            stream.close(grpc.StatusCode.PERMISSION_DENIED, "this device has been revoked")
        elif event == "connected":
            stream_id, _, connected_at = rest.partition(":")
            try:
                connected_at_us = int(connected_at)
            except ValueError:
                log.warning("unreadable device notification: %.200r", payload)
                return
            # Only a connection made after this stream's replaces it: the notice of an older
            # one (this replica's own included) can arrive after this stream was registered.
            if stream_id != stream.stream_id and connected_at_us > stream.connected_at_us:
                stream.close(grpc.StatusCode.ABORTED, "replaced by a newer connection")

    def _wake_streams(self) -> None:
        """Listening (again): every stream looks for what it missed meanwhile."""
        for stream in self.streams.values():
            stream.wake()

    def write_slot(self) -> asyncio.Future[None]:
        """Done at the next batch boundary, every WRITE_BATCH_SECONDS: for writes that can wait.

        Idle streams answer their devices' heartbeats in such batches. Writes started in one
        loop iteration cost much less each than the same writes spread out: gRPC's completion
        poller and the event loop wake once per batch rather than once per write (5,000 idle
        devices: about 10 % of a core instead of 11 %). Await it shielded: cancelling one
        waiter must not cancel it for all.
        """
        if self._write_slot is None:
            loop = asyncio.get_running_loop()
            self._write_slot = loop.create_future()
            loop.call_later(WRITE_BATCH_SECONDS, self._open_write_slot)
        return self._write_slot

    def _open_write_slot(self) -> None:
        slot, self._write_slot = self._write_slot, None
        if slot is not None and not slot.done():
            slot.set_result(None)

    def _sweep(self) -> None:
        """Every stream's liveness (DeviceStream.check_liveness), then again in a second."""
        now = time.monotonic()
        for stream in list(self.streams.values()):
            try:
                stream.check_liveness(now)
            except Exception:  # one stream's trouble must not stop the sweep for all
                log.exception("liveness check of %s failed", stream.device_id)
        self._sweeper = asyncio.get_running_loop().call_later(SWEEP_SECONDS, self._sweep)

    # -- the loop ------------------------------------------------------------------------

    async def run(self) -> None:
        last_touch_flush = asyncio.get_running_loop().time()
        self._sweeper = asyncio.get_running_loop().call_later(SWEEP_SECONDS, self._sweep)
        listener = listen(
            self.dsn,
            on_notify={Notify.COMMANDS: self._on_commands, Notify.DEVICES: self._on_devices},
            on_connect=self._wake_streams,
            name=self.name,
        )
        self._listener = await listener.start()

        async def step() -> None:
            nonlocal last_touch_flush
            await sleep_unless(self.stopping, POLL_SECONDS)
            if self.streams:
                held = await self.delivery.held_needing_attention(self.replica_id)
                for device_id, revoked in held:
                    # .get: the stream may have ended meanwhile (e.g. the revocation's own
                    # NOTIFY closed it).
                    stream = self.streams.get(device_id)
                    if stream is None:
                        continue
                    if revoked:
                        stream.close(
                            grpc.StatusCode.PERMISSION_DENIED, "this device has been revoked"
                        )
                    else:
                        stream.wake()
            now = asyncio.get_running_loop().time()
            if self._touched and now - last_touch_flush >= TOUCH_FLUSH_SECONDS:
                # Only devices still connected here: a stream that ended must stay offline.
                touched = [d for d in self._touched if d in self.streams]
                self._touched = set()
                last_touch_flush = now
                await registry.seen(self.delivery.pool, touched, self.replica_id)
                # A stream that ended during that UPDATE may have been cleared before it ran
                # (another pool connection): clear it again, or it stays listed as held here.
                gone = [d for d in touched if d not in self.streams]
                if gone:
                    await registry.gone(self.delivery.pool, gone, self.replica_id)

        try:
            await critical_loop(self.name, step, self.stopping)
        finally:
            if self._sweeper is not None:
                self._sweeper.cancel()
            for stream in list(self.streams.values()):
                stream.close(grpc.StatusCode.UNAVAILABLE, "gateway replica stopping; reconnect")
            await listener.close()
