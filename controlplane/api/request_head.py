"""A bound on the request line and headers, for uvicorn's httptools protocol.

uvicorn parses HTTP with httptools (llhttp) when it is installed: a third less CPU per
webhook than the pure-Python h11 (bench/RESULTS.md). llhttp has no limit on a request's
head and uvicorn sets none, so one connection sending an endless header line makes the
process hold all of it, before any ASGI code runs (h11 stops at
``h11_max_incomplete_event_size``). :class:`BoundedHttpToolsProtocol` keeps httptools and
applies that same setting, twice:

* while a head is incomplete, the bytes received are counted, and past the limit the
  connection is refused without waiting for the rest (what bounds memory);
* a head that arrives whole in one read is measured once parsed (what makes the limit
  exact, whatever the reads' sizes).

A refused request gets 431 with a JSON error and the connection is closed; the app never
sees it. Only the head is counted here; bodies are capped in :mod:`.body_limit`.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["BoundedHttpToolsProtocol"]

log = logging.getLogger(__name__)

DEFAULT_MAX_HEAD_BYTES = 16 << 10  # h11's default, when the setting is left unset
_REQUEST_LINE_FRAMING = len(b"  HTTP/1.1\r\n")  # around the method and the target
_HEADER_FRAMING = len(b": \r\n")


def _refusal(limit: int) -> bytes:
    message = (
        f"the request line and headers are over {limit >> 10} KB "
        "(SUPERAGENT_HTTP__MAX_HEADER_BYTES)"
    )
    body = json.dumps({"error": {"code": "headers_too_large", "message": message}}).encode()
    head = (
        "HTTP/1.1 431 Request Header Fields Too Large\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode() + body


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """httptools, refusing a request head over ``config.h11_max_incomplete_event_size``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._max_head = self.config.h11_max_incomplete_event_size or DEFAULT_MAX_HEAD_BYTES
        self._in_head = True  # waiting for (the rest of) a request line and headers
        self._head_bytes = 0
        self._refused = False

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        # Counted before parsing; the count is reset when a head completes, so only the
        # bytes of a head still incomplete add up.
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._refused or (self._in_head and self._head_bytes > self._max_head):
            self._refuse()

    def on_headers_complete(self) -> None:
        if self._refused:
            return
        self._in_head = False
        self._head_bytes = 0
        size = len(self.parser.get_method()) + len(self.url) + _REQUEST_LINE_FRAMING
        size += sum(len(name) + len(value) + _HEADER_FRAMING for name, value in self.headers)
        if size > self._max_head:
            self._refused = True  # answered once this read is parsed; the app never runs
            return
        super().on_headers_complete()

    def handle_websocket_upgrade(self) -> None:
        if not self._refused:  # a refused head is never upgraded
            super().handle_websocket_upgrade()

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        super().on_message_complete()
        # The next bytes on this connection begin another request's head.
        self._in_head = True
        self._head_bytes = 0

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._refused and not self.pipeline:  # the requests before the refused one are answered
            self._refuse()

    def _refuse(self) -> None:
        self._refused = True
        if self.transport.is_closing():
            return
        if self.pipeline or (self.cycle is not None and not self.cycle.response_complete):
            self.flow.pause_reading()  # answered in order, after the requests before it
            return
        client = self.client[0] if self.client else "?"
        log.warning("request head over %d bytes from %s: refused", self._max_head, client)
        self.transport.write(_refusal(self._max_head))
        self.transport.close()
