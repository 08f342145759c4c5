"""One chat connection (websocket), from its first frame to its last.

Client frames (JSON text):

* ``{"type": "say", "thread": <conversation id or null>, "text": …, "client_id": <uuid>,
  "track": <optional bool>}`` → ``{"type": "accepted", "trigger", "thread", "client_id",
  "duplicate", "verdict", "route", "reason"}``, and the socket watches that conversation;
  with ``"track": true``, also ``progress`` frames about the message until it is settled;
* ``{"type": "watch", "thread": …}`` → its history, then every new message;
* ``{"type": "unwatch", "thread": …}``.

Server frames: ``ready`` (once, on connect), ``accepted``, ``message`` (people's and the
agent's, see :meth:`ChatMessage.frame`), ``progress`` (what a tracked message was
promised and what of it arrived, see :mod:`controlplane.channels.webchat.progress`; sent
after the messages it counts, only to the socket that asked), ``error`` (``message``, and
the ``client_id`` of the frame it answers when readable). Bad input gets an error frame
and the socket stays open; nothing about a bad frame is stored.

One task reads, one writes (so frames go out in the order they were queued), and a socket
that falls :data:`~controlplane.channels.webchat.hub.MAX_QUEUED` frames behind is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from starlette.websockets import WebSocket

from controlplane.channels.webchat import events, history
from controlplane.channels.webchat.adapter import WebChatAdapter
from controlplane.channels.webchat.hub import ChatClient
from controlplane.errors import NotFound, SuperagentError
from controlplane.services import is_transient

log = logging.getLogger(__name__)

CLOSE_UNAUTHORIZED = 1008  # policy violation: no or wrong token, a foreign origin
CLOSE_TOO_SLOW = 1013  # try again later: the socket fell too far behind
CLOSE_BAD_REQUEST = 4400  # the connection's own parameters (its name) are wrong
CLOSE_OFF = 4404  # the chat is turned off on this control plane


async def refuse(websocket: WebSocket, code: int, message: str) -> None:
    """Say why in an error frame (a close reason is cut at 123 bytes), then close."""
    with contextlib.suppress(Exception):
        await websocket.send_json({"type": "error", "message": message})
        reason = message.encode()[:120].decode(errors="ignore")
        await websocket.close(code, reason)


async def converse(websocket: WebSocket, adapter: WebChatAdapter, client: ChatClient) -> None:
    """Serve an accepted, authorized socket until it closes."""
    client.push({"type": "ready", "actor": client.actor.id, "name": client.actor.name})
    writer = asyncio.create_task(_write(websocket, client))
    reader = asyncio.create_task(_read(websocket, adapter, client))
    behind = asyncio.create_task(client.overflowed.wait())
    tasks = (writer, reader, behind)
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        if behind in done:
            with contextlib.suppress(Exception):
                await websocket.close(CLOSE_TOO_SLOW, "too far behind; reconnect")
    finally:
        adapter.hub.leave(client)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _write(websocket: WebSocket, client: ChatClient) -> None:
    while True:
        frame = await client.frames.get()
        await websocket.send_json(frame)


async def _read(websocket: WebSocket, adapter: WebChatAdapter, client: ChatClient) -> None:
    while True:
        received = await websocket.receive()
        if received["type"] == "websocket.disconnect":
            return
        raw = received.get("text")
        try:
            await _handle(adapter, client, events.parse(raw))
        except Exception as exc:
            client.push(_error_frame(exc, raw))


def _error_frame(exc: Exception, raw: str | None) -> dict[str, Any]:
    if isinstance(exc, SuperagentError):
        message = exc.message
    elif is_transient(exc):
        message = "the control plane cannot reach its database; resend with the same client_id"
    else:
        log.exception("webchat: frame failed", exc_info=exc)
        message = "internal error; see the control plane's log"
    frame: dict[str, Any] = {"type": "error", "message": message}
    if raw is not None and len(raw) <= events.MAX_FRAME_CHARS:
        frame["client_id"] = events.client_id_in(raw)
    return frame


async def _handle(adapter: WebChatAdapter, client: ChatClient, frame: events.Frame) -> None:
    if isinstance(frame, events.Say):
        await _say(adapter, client, frame)
    elif isinstance(frame, events.Watch):
        if not await history.exists(adapter.pool, frame.thread):
            raise NotFound(f"no conversation {frame.thread}")
        adapter.hub.watch(client, frame.thread)
    else:
        adapter.hub.unwatch(client, frame.thread)


async def _say(adapter: WebChatAdapter, client: ChatClient, say: events.Say) -> None:
    who = client.actor
    if say.track:
        client.check_can_track()  # before anything is recorded: a refusal records nothing
    thread = say.thread or events.new_conversation(who.id, say.client_id)
    if say.thread is not None and not await history.exists(adapter.pool, thread):
        raise NotFound(f"no conversation {thread}; leave thread empty to start one")
    ingested = await adapter.intake.ingest(events.trigger(who, say, thread))
    if ingested.duplicate:  # a resent frame: answer as the first time
        thread = await history.conversation_of(adapter.pool, ingested.thread_id)
    client.push(
        {
            "type": "accepted",
            "trigger": ingested.trigger_id,
            "thread": thread,
            "client_id": say.client_id,
            "duplicate": ingested.duplicate,
            "verdict": ingested.verdict,
            "route": ingested.route,
            "reason": ingested.reason,
        }
    )
    if say.track:
        client.track(thread, ingested.trigger_id)
    adapter.hub.watch(client, thread)
    await adapter.hub.announce(thread)
