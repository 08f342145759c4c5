"""The cap on every HTTP request body: one pure-ASGI middleware, outermost in the app.

It runs before routing, authentication and FastAPI's body parsing (which reads a JSON body
whole before any dependency runs), so no endpoint, public or not, can be made to hold more
than its cap, and a body over it gets 413 whoever sends it:

* a declared ``Content-Length`` over the cap is answered 413 at once: the app is never
  called and not one byte of the body is read;
* a chunked body (no length declared) is counted as it streams through ``receive``; the
  chunk that passes the cap is not handed on, the app's read fails, whatever the app
  answers is dropped, and the middleware answers 413 itself;
* when the app answers a chunked request without reading it (a refusal for a missing
  token, say), the rest of the body is read and discarded, chunk by chunk, before that
  answer goes out, so that a body over the cap still gets its 413.

A 413 carries ``Connection: close``: the server stops reading instead of draining the rest.
Limits come from :class:`~controlplane.settings.HttpSettings`: one default, and one per
webhook path, whose senders have their own documented maxima. What this module must not
do: keep a body, or look at anything but the path and the framing headers. (A handler that
answers while it is still reading its body, a duplex stream, would not fit; there is none.)
"""

from __future__ import annotations

import asyncio
import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from controlplane.errors import PayloadTooLarge
from controlplane.settings import ENV_PREFIX, HttpSettings

__all__ = ["BodyLimit", "BodyTooLarge"]

# Paths with a cap of their own, and the HttpSettings field that holds it.
_ROUTE_FIELDS = {
    "/webhooks/github": "github_webhook_max_body_bytes",
    "/webhooks/slack": "slack_webhook_max_body_bytes",
    "/webhooks/lark": "lark_webhook_max_body_bytes",
}
_DEFAULT_FIELD = "max_body_bytes"
DRAIN_SECONDS = 10.0  # for the rest of a chunked body the app answered early


class BodyTooLarge(PayloadTooLarge):
    """Raised into the app from ``receive`` when a streamed body passes its cap."""


def _size(limit: int) -> str:
    if limit % (1 << 20) == 0:
        return f"{limit >> 20} MB"
    if limit % (1 << 10) == 0:
        return f"{limit >> 10} KB"
    return f"{limit} bytes"


class _Cap:
    def __init__(self, limit: int, field: str) -> None:
        self.limit = limit
        setting = f"{ENV_PREFIX}HTTP__{field.upper()}"
        self.message = f"the body is over {_size(limit)}, this endpoint's limit ({setting})"
        content = {"error": {"code": PayloadTooLarge.code, "message": self.message}}
        self.body = json.dumps(content).encode()


class BodyLimit:
    """ASGI middleware: 413 for a request body over its path's cap, before the app reads it."""

    def __init__(self, app: ASGIApp, settings: HttpSettings) -> None:
        self.app = app
        self.default = _Cap(getattr(settings, _DEFAULT_FIELD), _DEFAULT_FIELD)
        self.routes = {
            path: _Cap(getattr(settings, field), field) for path, field in _ROUTE_FIELDS.items()
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # websockets: bounded per message by the server
            await self.app(scope, receive, send)
            return
        cap = self.routes.get(scope["path"], self.default)
        declared = _content_length(scope)
        if declared is not None and declared > cap.limit:
            await _refuse(send, cap)
            return
        await _Request(self.app, cap, streamed=declared is None).run(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            # The server has already refused malformed or conflicting values.
            return int(value) if value.isdigit() else None
    return None


async def _refuse(send: Send, cap: _Cap) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(cap.body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": cap.body})


class _Request:
    """One request whose body is counted as it is received, by the app or by us."""

    def __init__(self, app: ASGIApp, cap: _Cap, *, streamed: bool) -> None:
        self.app = app
        self.cap = cap
        self.received = 0
        self.complete = not streamed  # a Content-Length within the cap bounds the rest
        self.over = False
        self.started = False  # the app's answer went out (begun before the body was over)

    def _count(self, message: Message) -> None:
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            self.complete = not message.get("more_body", False)
            if self.received > self.cap.limit:
                self.over = True
        else:  # http.disconnect: nothing more will come
            self.complete = True

    async def run(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def counted_receive() -> Message:
            if not self.over:
                message = await receive()
                self._count(message)
            if self.over:  # the chunk that passed the cap is not handed on
                raise BodyTooLarge(self.cap.message)
            return message

        async def guarded_send(message: Message) -> None:
            if message["type"] == "http.response.start" and not self.complete and not self.over:
                await self._drain(receive, message)
            if self.over and not self.started:
                return  # the app's answer to a body it never got whole: ours goes instead
            if message["type"] == "http.response.start":
                self.started = True
            await send(message)

        try:
            await self.app(scope, counted_receive, guarded_send)
        except Exception:
            if not self.over or self.started:
                raise
            # What the app made of the failed read (a 400, an error handler's 500 re-raised)
            # is not the caller's answer: the 413 below is.
        if self.over and not self.started:
            await _refuse(send, self.cap)

    async def _drain(self, receive: Receive, start: Message) -> None:
        """The app answers a chunked request before its body is in (a refusal, often, like
        a missing token): read the rest, discarding it, so that a body over the cap gets
        its 413 whatever the app would have said. Bounded in time; past it, the app's
        answer goes out and the connection is closed."""
        try:
            async with asyncio.timeout(DRAIN_SECONDS):
                while not self.complete and not self.over:
                    self._count(await receive())
        except TimeoutError:
            start["headers"] = [*start.get("headers", []), (b"connection", b"close")]
