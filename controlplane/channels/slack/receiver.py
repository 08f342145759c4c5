"""Slack Socket Mode: events over a websocket the control plane dials (no public ingress).

Runs on every replica; Slack spreads events over an app's open connections (up to ten).

One connection's life: ``apps.connections.open`` with the app-level token gives a
single-use ``wss://`` URL; Slack says ``hello``; then ``events_api`` envelopes arrive, each
acknowledged with ``{"envelope_id": ...}`` only AFTER its event was ingested (committed),
so an event lost to a crash or a database outage is redelivered by Slack rather than
dropped. Other envelope types (slash commands, interactivity) are acknowledged and
otherwise ignored. ``disconnect`` (Slack refreshes connections every few hours) means:
open a new one at once, with a new URL. Errors back off with jitter
(:func:`critical_loop`); a configuration problem (a refused token, Socket Mode turned off)
is logged and retried slowly, without taking the control plane down.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import TYPE_CHECKING, Any

import asyncpg
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import WebSocketException

from controlplane import failures
from controlplane.channels.base import ChannelError, Ignored, RateLimited
from controlplane.channels.slack.client import WebApi
from controlplane.errors import InvalidInput, TransientError
from controlplane.services import Service, critical_loop, is_transient, sleep_unless

if TYPE_CHECKING:
    from controlplane.channels.slack.adapter import SlackAdapter

log = logging.getLogger(__name__)

CONFIG_RETRY_SECONDS = 60.0  # after a configuration error: someone has to fix something
_MAX_FRAME = 4 << 20


class SocketModeService(Service):
    name = "slack-socket-mode"

    def __init__(self, adapter: SlackAdapter, app_api: WebApi) -> None:
        super().__init__()
        self.adapter = adapter
        self.app_api = app_api

    async def run(self) -> None:
        await critical_loop(self.name, self._connection, self.stopping)

    async def _connection(self) -> None:
        """One connection, from opening to its end; returning means "reconnect now"."""
        try:
            body = await self.app_api.call("apps.connections.open", form={})
        except ChannelError as exc:
            log.error("slack socket mode cannot connect: %s", exc)
            await sleep_unless(self.stopping, CONFIG_RETRY_SECONDS)
            return
        except RateLimited as exc:
            await sleep_unless(self.stopping, exc.seconds)
            return
        url = body.get("url")
        if not isinstance(url, str) or not url.startswith(("wss://", "ws://")):
            raise TransientError("Slack apps.connections.open gave no websocket URL")
        try:
            async with connect(url, max_size=_MAX_FRAME, open_timeout=10) as ws:
                await self._serve(ws)
        except WebSocketException as exc:
            # Closed, refused or garbled connections pass; critical_loop backs off on these.
            raise TransientError(f"Slack Socket Mode connection: {exc}") from None

    async def _serve(self, ws: ClientConnection) -> None:
        while True:
            raw = await self._receive(ws)
            if raw is None:
                return  # stopping
            try:
                frame = json.loads(raw)
            except (ValueError, RecursionError):
                log.warning("slack socket mode: a frame that is not JSON; skipped")
                continue
            if not isinstance(frame, dict):
                continue
            kind = frame.get("type")
            if kind == "hello":
                log.info("slack socket mode connected")
                await self._check_bot_token()
                continue
            if kind == "disconnect":
                reason = frame.get("reason")
                if reason == "link_disabled":
                    log.error(
                        "slack socket mode: Socket Mode is off for this app; turn it on in "
                        "the app's settings (Socket Mode), or unset SUPERAGENT_SLACK__APP_TOKEN"
                    )
                    await sleep_unless(self.stopping, CONFIG_RETRY_SECONDS)
                else:
                    log.info("slack socket mode: disconnect (%s); reconnecting", reason)
                return
            envelope_id = frame.get("envelope_id")
            if not isinstance(envelope_id, str) or not envelope_id:
                log.debug("slack socket mode: %s frame ignored", kind)
                continue
            if kind == "events_api" and not await self._handle(envelope_id, frame):
                continue  # not acknowledged: Slack delivers it again
            await ws.send(json.dumps({"envelope_id": envelope_id}))

    async def _check_bot_token(self) -> None:
        # The bot token is needed for the first event anyway (who the agent is); asking now
        # puts a broken token in the log at startup rather than at the first mention.
        try:
            await self.adapter.identity()
        except Exception as exc:
            log.warning("slack socket mode: events will wait: %s", exc)

    async def _receive(self, ws: ClientConnection) -> str | bytes | None:
        """The next frame, or None once the service is stopping."""
        receiving = asyncio.ensure_future(ws.recv())
        stopping = asyncio.ensure_future(self.stopping.wait())
        done, pending = await asyncio.wait(
            {receiving, stopping}, return_when=asyncio.FIRST_COMPLETED
        )
        for task in pending:
            task.cancel()  # cancelling recv() loses no data
        if receiving in done:
            return receiving.result()
        return None

    async def _handle(self, envelope_id: str, frame: dict[str, Any]) -> bool:
        """Ingest the envelope's event; whether to acknowledge it."""
        payload = frame.get("payload")
        if not isinstance(payload, dict) or payload.get("type") != "event_callback":
            return True
        try:
            result = await self.adapter.receive(payload, retried=bool(frame.get("retry_attempt")))
        except InvalidInput as exc:
            log.warning("slack envelope %s dropped: %s", envelope_id, exc)
            return True  # malformed stays malformed: a redelivery would not help
        except Exception as exc:
            if is_transient(exc) or isinstance(exc, RateLimited):
                log.warning("slack envelope %s not ingested yet: %s", envelope_id, exc)
            else:
                # Our bug, this envelope's failure: Slack redelivers it a few times.
                failures.logged(log, "slack", envelope_id, exc, "Slack delivers it again")
                with contextlib.suppress(asyncpg.PostgresError, OSError):
                    await failures.record(self.adapter.intake.pool, "slack", envelope_id, exc)
            return False
        if isinstance(result, Ignored):
            log.debug("slack event %s ignored: %s", payload.get("event_id"), result.reason)
        return True
