"""Log output and trace ids.

Owns the log format (plain text, the default, or one JSON object per line when
``SUPERAGENT_LOG_FORMAT=json``) and the trace id: a context variable that the HTTP
middleware sets for each request and background loops set with ``with trace(id):``, so
that every line logged on behalf of one request or one piece of work can be found by it.

It adds only the time, level, logger, message, exception and trace id to a line: nothing
that could carry a secret which the message itself did not.

It also quiets gRPC's C core (below), and writes ``superagent up``'s log to a file of the
state directory as well (:func:`log_to_file`).
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from starlette.applications import Starlette
from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from superagent_shared import log_json

FORMAT_ENV = "SUPERAGENT_LOG_FORMAT"
FORMATS = ("plain", "json")
REQUEST_ID_HEADER = "X-Request-Id"

_trace_id: ContextVar[str | None] = ContextVar("superagent_trace_id", default=None)

# W3C Trace Context: version-traceid-parentid-flags; an all-zero trace id is invalid.
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}")
# A caller's request id goes into every log line and back into a header: only short,
# printable ids without quotes or spaces, so that it cannot forge or break a plain line.
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:/+=-]{1,128}$")


def new_trace_id() -> str:
    """32 hex digits: the shape of a W3C trace id, so tracing systems accept it too."""
    return uuid.uuid4().hex


def current_trace_id() -> str | None:
    return _trace_id.get()


@contextmanager
def trace(trace_id: str | None = None) -> Iterator[str]:
    """Log lines within the block carry ``trace_id`` (a new one when not given)."""
    chosen = trace_id or new_trace_id()
    token = _trace_id.set(chosen)
    try:
        yield chosen
    finally:
        _trace_id.reset(token)


class JsonFormatter(log_json.JsonFormatter):
    """One JSON object per line (:mod:`superagent_shared.log_json`, the shape endpointd's
    `run --json` writes too), with trace_id when set."""

    def fields(self, record: logging.LogRecord) -> dict[str, str]:
        # Read when the line is written, which for the stream handlers used here is in the
        # logging call itself, within the context of the code that logged.
        trace_id = current_trace_id()
        return {} if trace_id is None else {"trace_id": trace_id}


def apply_format() -> None:
    """Give the root logger's handlers the format ``SUPERAGENT_LOG_FORMAT`` asks for."""
    wanted = os.environ.get(FORMAT_ENV, "").strip().lower() or "plain"
    if wanted == "plain":
        return
    if wanted not in FORMATS:
        # Logging is set up before anything can report a configuration error cleanly, and
        # a wrong log format is no reason to refuse to run: say so and keep plain lines.
        logging.getLogger(__name__).warning(
            "%s=%r is not one of %s; logging plain text",
            FORMAT_ENV,
            wanted,
            ", ".join(FORMATS),
        )
        return
    for handler in logging.getLogger().handlers:
        handler.setFormatter(JsonFormatter())


LOG_FILE_BYTES = 10 * 1024 * 1024
LOG_FILE_BACKUPS = 5


def log_file(state_dir: Path) -> Path:
    """Where ``superagent up`` writes its log: ``<state dir>/logs/superagent.log``."""
    return state_dir / "logs" / "superagent.log"


def log_to_file(state_dir: Path) -> Path:
    """Also write the log to :func:`log_file` (10 MiB × 5 files, rotated), in the format of
    the existing handlers; returns its path. Call after logging is set up.

    For ``superagent up``, which runs in a terminal that is closed sooner or later; not for
    ``serve``, whose output belongs to its platform (journald, a container runtime).
    """
    path = log_file(state_dir)
    # 0700/0600: the log names devices, users and tickets; it is the operator's alone.
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    root = logging.getLogger()
    for existing in root.handlers:
        if (
            isinstance(existing, logging.handlers.RotatingFileHandler)
            and Path(existing.baseFilename) == path.resolve()
        ):
            return path  # already (a second `up` in one process, as tests do)
    handler = logging.handlers.RotatingFileHandler(
        path, maxBytes=LOG_FILE_BYTES, backupCount=LOG_FILE_BACKUPS, encoding="utf-8"
    )
    os.chmod(path, 0o600)
    template = root.handlers[0].formatter if root.handlers else None
    handler.setFormatter(
        template or logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s")
    )
    root.addHandler(handler)
    return path


def incoming_trace_id(headers: Headers) -> str | None:
    """The trace id a caller sent: W3C ``traceparent`` first, else ``X-Request-Id``."""
    parent = _TRACEPARENT.match(headers.get("traceparent", "").strip().lower())
    if parent is not None and parent[1] != "0" * 32:
        return parent[1]
    request_id = headers.get(REQUEST_ID_HEADER, "").strip()
    if _REQUEST_ID.match(request_id):
        return request_id
    return None


class TraceMiddleware:
    """Sets the trace id for each HTTP request and websocket, and echoes it in
    ``X-Request-Id`` on HTTP responses."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        trace_id = incoming_trace_id(Headers(scope=scope)) or new_trace_id()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)[REQUEST_ID_HEADER] = trace_id
            await send(message)

        token = _trace_id.set(trace_id)
        await self.app(scope, receive, send_with_id)
        # Reset only when the app returned: Starlette's handler for unexpected errors runs
        # outside every middleware, in this same task, and its log line should name the
        # request. Servers run each request in a task of its own, so the id ends with it.
        _trace_id.reset(token)


def install(app: Starlette) -> None:
    """Trace ids on every request of ``app``."""
    app.add_middleware(TraceMiddleware)
