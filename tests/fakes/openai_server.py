"""Fake OpenAI-compatible HTTP server for tests (owned by the test suite, not the product).

This module owns:

* ``FakeOpenAIServer`` - a real HTTP server on ``127.0.0.1`` (ephemeral port), run by uvicorn
  in a background thread with its own event loop, so it works from sync and async tests alike.
  Point the product's official ``openai`` client at ``server.url``
  (``http://127.0.0.1:PORT/v1``) and ``server.api_key``.
* The scripting API: ``Reply`` / ``ToolCall`` values queued with ``server.script(...)`` and
  consumed in order, or computed by ``server.respond_with(callback)`` from a parsed
  ``ChatRequest``.  Scripted replies take precedence; the callback is used once the queue is
  empty.  With neither, the server answers HTTP 409 in OpenAI's error shape
  (``code="no_script"``, ``x-should-retry: false``) so the client raises ``openai.ConflictError``
  straight away.
* Endpoints: ``POST /v1/chat/completions`` (JSON and SSE streaming, tool calls,
  ``stream_options.include_usage``) and ``GET /v1/models`` (+ ``GET /v1/models/{id}``).
  Anything else is a 404 in OpenAI's error shape.
* Usage accounting.  Token counts are deterministic estimates: ``ceil(chars / chars_per_token)``
  (default 4) over the *prompt text* (canonical JSON of ``tools``, then one canonical JSON line
  per message) and over the output (content + each tool call's name and arguments).
  Cached tokens come from ``Reply.cached_tokens`` when set; otherwise, with
  ``cache_mode="prefix"`` (the default), from an automatic prefix-cache model: the server
  remembers the prompt text of every successful completion (per model) and reports as cached
  the longest common prefix with any earlier prompt, in tokens, rounded down to a multiple of
  ``cache_block_tokens`` (default 64) and capped at ``prompt_tokens``.  ``cache_mode="off"``
  always reports 0 unless the reply says otherwise.  ``Reply.prompt_tokens`` /
  ``Reply.completion_tokens`` override the estimates.
* ``LatencyModel`` - server-side ``asyncio.sleep`` of
  ``fixed_ms + per_prompt_token_ms * prompt_tokens`` before the response (time to first chunk
  when streaming) plus ``per_completion_token_ms * completion_tokens`` (spread evenly across the
  content / argument chunks when streaming), plus any per-reply ``Reply.delay_ms``.
* A request log (``server.requests``: method, path, headers, raw body text, parsed JSON, status,
  usage), ``server.all_request_text()`` and ``server.assert_never_saw(secret)`` for
  canary-secret checks.
* Auth: when ``api_key`` is set (the default is ``FAKE_API_KEY``), every request must carry
  ``Authorization: Bearer <api_key>``; otherwise 401 in OpenAI's error shape.  Malformed JSON
  bodies get 400.
* Faults, as real providers and gateways produce them: ``fault(kind)`` is a script item
  for one call (``server.script(fault("empty_choices"), "ok")``), one of :data:`FAULTS`;
  ``server.inject_faults(probability, seed=...)`` replaces each chat request's answer by
  a random fault with that probability (seeded: the same run faults the same calls), for
  soak tests. ``server.faults_injected`` lists what was injected, in order.
* A context window: ``FakeOpenAIServer(context_window=N)`` (or setting
  ``server.context_window``) answers a chat request whose estimated prompt tokens exceed
  ``N`` with 400 ``context_length_exceeded``, as ``fault("context_length")`` does, without
  taking a script item.
* The function-scoped pytest fixture ``fake_llm``.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import random
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeAlias

import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.fakes.loopback import LoopbackFake, LoopbackServer

__all__ = [
    "FAKE_API_KEY",
    "FAKE_MODEL",
    "FAULTS",
    "ChatRequest",
    "FakeOpenAIServer",
    "LatencyModel",
    "RecordedRequest",
    "Reply",
    "ReplyCallback",
    "ToolCall",
    "fake_llm",
    "fault",
    "message_text",
]

FAKE_API_KEY = "sk-fake-test-key"
FAKE_MODEL = "fake-model"

_HTTP_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


# --------------------------------------------------------------------------------------------
# Public value types
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolCall:
    """A function tool call the fake model makes.

    ``arguments`` may be a mapping (serialized as JSON) or a raw string (sent verbatim, which
    lets tests produce malformed arguments).  ``id`` defaults to a deterministic
    ``call_fake_<n>``.
    """

    name: str
    arguments: Mapping[str, Any] | str = field(default_factory=dict)
    id: str | None = None

    def arguments_json(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(dict(self.arguments), ensure_ascii=False)


@dataclass(frozen=True)
class Reply:
    """One scripted or computed response.

    Success: ``content`` and/or ``tool_calls``.  ``finish_reason`` defaults to ``"tool_calls"``
    when there are tool calls, else ``"stop"``.

    Error: set ``error_status`` (e.g. 429); the body is OpenAI's error shape with
    ``error_message`` / ``error_type`` / ``error_code`` (type and code default by status).
    ``retry_after`` adds a ``retry-after`` header (seconds); ``should_retry`` adds
    ``x-should-retry: true|false`` (the openai client obeys it over its status-based policy).

    ``cached_tokens`` / ``prompt_tokens`` / ``completion_tokens`` override usage accounting;
    ``delay_ms`` adds latency on top of the server's ``LatencyModel``; ``headers`` are added to
    the HTTP response; ``model`` overrides the ``model`` field of the response.
    """

    content: str | None = None
    tool_calls: Sequence[ToolCall] = ()
    finish_reason: str | None = None
    cached_tokens: int | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    delay_ms: float = 0.0
    error_status: int | None = None
    error_message: str = "fake server: scripted error"
    error_type: str | None = None
    error_code: str | None = None
    retry_after: float | None = None
    should_retry: bool | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    model: str | None = None
    raw_body: str | None = None
    """Sent verbatim (with ``raw_status`` and ``raw_content_type``) instead of a completion:
    a proxy's HTML page, a completion without choices."""
    raw_status: int = 200
    raw_content_type: str = "application/json"

    @property
    def is_error(self) -> bool:
        return self.error_status is not None

    def output_text(self) -> str:
        """Text the completion-token estimate is computed from."""
        parts = [self.content or ""]
        parts.extend(tc.name + tc.arguments_json() for tc in self.tool_calls)
        return "".join(parts)


@dataclass(frozen=True)
class LatencyModel:
    """Server-side latency: ``fixed_ms + per_prompt_token_ms * prompt_tokens`` before the first
    byte of the answer, ``per_completion_token_ms * completion_tokens`` while producing it."""

    fixed_ms: float = 0.0
    per_prompt_token_ms: float = 0.0
    per_completion_token_ms: float = 0.0

    def first_token_seconds(self, prompt_tokens: int) -> float:
        return (self.fixed_ms + self.per_prompt_token_ms * prompt_tokens) / 1000.0

    def completion_seconds(self, completion_tokens: int) -> float:
        return self.per_completion_token_ms * completion_tokens / 1000.0

    def total_seconds(self, prompt_tokens: int, completion_tokens: int) -> float:
        return self.first_token_seconds(prompt_tokens) + self.completion_seconds(completion_tokens)


def message_text(message: Mapping[str, Any]) -> str:
    """Text of a chat message whose ``content`` is a string or a list of content parts."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts: list[str] = []
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif isinstance(part, str):
                texts.append(part)
        return "".join(texts)
    return ""


@dataclass(frozen=True)
class ChatRequest:
    """A parsed ``POST /v1/chat/completions`` request, as handed to reply callbacks."""

    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    stream: bool
    body: dict[str, Any]
    headers: dict[str, str]
    index: int
    """0-based ordinal among chat-completion requests this server has parsed."""

    def last_message(self) -> dict[str, Any] | None:
        return self.messages[-1] if self.messages else None

    def last_user_message(self) -> str | None:
        for message in reversed(self.messages):
            if message.get("role") == "user":
                return message_text(message)
        return None

    def system_prompt(self) -> str | None:
        for message in self.messages:
            if message.get("role") in ("system", "developer"):
                return message_text(message)
        return None

    def tool_names(self) -> list[str]:
        names: list[str] = []
        for tool in self.tools:
            function = tool.get("function")
            if isinstance(function, Mapping) and isinstance(function.get("name"), str):
                names.append(function["name"])
        return names

    def tool_results(self) -> list[dict[str, Any]]:
        """Messages with ``role == "tool"`` (results the client sent back)."""
        return [m for m in self.messages if m.get("role") == "tool"]

    def text(self) -> str:
        """All message texts joined by newlines."""
        return "\n".join(message_text(m) for m in self.messages)


@dataclass
class RecordedRequest:
    """One HTTP request the server received (recorded before auth/validation)."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body_text: str
    json_body: Any | None
    """Parsed JSON body, or ``None`` when the body is empty or not valid JSON."""
    received_at: float
    status: int | None = None
    """HTTP status that was (or is being) returned."""
    reply: Reply | None = None
    usage: dict[str, Any] | None = None


ReplyCallback: TypeAlias = Callable[[ChatRequest], Reply | str | Awaitable[Reply | str]]
"""Computes a reply from a parsed request; may be sync or async (async ones run on the
server's own event loop, in the server thread)."""

ScriptItem: TypeAlias = Reply | str | ReplyCallback


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _common_prefix_len(a: str, b: str) -> int:
    """Length of the longest common prefix (binary search over C-level slice compares)."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while lo < hi:  # invariant: a[:lo] == b[:lo] and a[:hi + 1] != b[:hi + 1]
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _chunks(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def _default_error_type_and_code(status: int) -> tuple[str, str | None]:
    if status == 401:
        return "invalid_request_error", "invalid_api_key"
    if status == 403:
        return "permission_error", None
    if status == 404:
        return "invalid_request_error", "not_found"
    if status == 429:
        return "requests", "rate_limit_exceeded"
    if status >= 500:
        return "server_error", None
    return "invalid_request_error", None


def _error_response(
    status: int,
    message: str,
    *,
    error_type: str | None = None,
    code: str | None = None,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    default_type, default_code = _default_error_type_and_code(status)
    body = {
        "error": {
            "message": message,
            "type": error_type or default_type,
            "param": param,
            "code": code if code is not None else default_code,
        }
    }
    return JSONResponse(body, status_code=status, headers=dict(headers or {}))


def _sse(payload: Mapping[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"


def _usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


@dataclass(frozen=True)
class _Planned:
    """A reply plus everything computed for it (ids, usage) before it is sent."""

    reply: Reply
    completion_id: str
    model: str
    created: int
    tool_call_ids: list[str]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


# --------------------------------------------------------------------------------------------
# Faults
# --------------------------------------------------------------------------------------------

_HTML = (
    "<html><head><title>502 Bad Gateway</title></head><body><center><h1>502 Bad Gateway"
    "</h1></center><hr><center>nginx</center></body></html>"
)


def _completion_json(choices: list[Any]) -> str:
    return json.dumps(
        {
            "id": "chatcmpl-fault",
            "object": "chat.completion",
            "created": 1700000000,
            "model": FAKE_MODEL,
            "choices": choices,
            "usage": _usage(10, 0, 0),
        }
    )


def _first_tool(request: ChatRequest) -> str:
    names = request.tool_names()
    return names[0] if names else "some_tool"


def _invalid_arguments(request: ChatRequest) -> Reply:
    # A property that no tool has, of the wrong type: invalid against any strict schema.
    return Reply(tool_calls=[ToolCall(_first_tool(request), {"__not_a_parameter": 42})])


def _parallel_storm(request: ChatRequest) -> Reply:
    call = ToolCall(_first_tool(request), {"__not_a_parameter": 42})
    return Reply(tool_calls=[call] * 300)


FAULTS: dict[str, ScriptItem] = {
    "empty_choices": Reply(raw_body=_completion_json([])),
    "null_message": Reply(
        raw_body=_completion_json([{"index": 0, "message": None, "finish_reason": "stop"}])
    ),
    "html_200": Reply(raw_body=_HTML, raw_content_type="text/html"),
    "rate_limited": Reply(
        error_status=429,
        retry_after=1,
        error_message="Rate limit reached for requests. Please try again in 1s.",
    ),
    "server_error": Reply(error_status=500, error_message="The server had an error."),
    "bad_gateway": Reply(raw_body=_HTML, raw_status=502, raw_content_type="text/html"),
    "unavailable": Reply(error_status=503, error_message="The engine is currently overloaded."),
    "context_length": Reply(
        error_status=400,
        error_code="context_length_exceeded",
        error_message="This model's maximum context length is 8192 tokens. However, your "
        "messages resulted in 9120 tokens. Please reduce the length of the messages.",
        should_retry=False,
    ),
    "unauthorized": Reply(error_status=401, error_message="Incorrect API key provided: sk-***."),
    "model_not_found": Reply(
        error_status=404,
        error_code="model_not_found",
        error_message="The model `fake-model` does not exist or you do not have access to it.",
    ),
    "slow": Reply(content="too late", delay_ms=5_000),  # past a short client timeout
    "truncated_tool_call": Reply(
        tool_calls=[ToolCall("some_tool", '{"command": "echo unfinish')],
        finish_reason="length",
    ),
    "invalid_tool_arguments": _invalid_arguments,
    "unknown_tool": Reply(tool_calls=[ToolCall("no_such_tool", {"x": 1})]),
    "parallel_storm": _parallel_storm,
}
"""Every fault class the fake can produce, by name (see :func:`fault`)."""


def fault(kind: str) -> ScriptItem:
    """A script item that answers one call with the fault ``kind`` (a key of FAULTS)."""
    if kind not in FAULTS:
        raise ValueError(f"no fault {kind!r}; the faults are {', '.join(FAULTS)}")
    return FAULTS[kind]


# --------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------


class FakeOpenAIServer(LoopbackFake):
    """Fake OpenAI-compatible server; see the module docstring for behaviour.

    Use as ``with FakeOpenAIServer() as fake: ...`` or ``start()`` / ``stop()``.  All public
    methods are thread-safe and may be called while requests are in flight.
    """

    def __init__(
        self,
        *,
        api_key: str | None = FAKE_API_KEY,
        models: Sequence[str] = (FAKE_MODEL,),
        latency: LatencyModel | None = None,
        cache_mode: Literal["prefix", "off"] = "prefix",
        cache_block_tokens: int = 64,
        chars_per_token: int = 4,
        stream_chunk_chars: int = 8,
        reject_unknown_models: bool = False,
        host: str = "127.0.0.1",
        context_window: int | None = None,
        tls: tuple[str, str] | None = None,
    ) -> None:
        if cache_block_tokens < 1 or chars_per_token < 1 or stream_chunk_chars < 1:
            raise ValueError("cache_block_tokens, chars_per_token, stream_chunk_chars must be >= 1")
        self.api_key = api_key
        self.models = list(models)
        self.latency = latency or LatencyModel()
        self.cache_mode: Literal["prefix", "off"] = cache_mode
        self.cache_block_tokens = cache_block_tokens
        self.chars_per_token = chars_per_token
        self.stream_chunk_chars = stream_chunk_chars
        # A provider that ignores the request's output cap, when False.
        self.honour_output_cap = True
        # A server that refuses strict tool schemas (some gateways and older servers), and
        # one that refuses `max_tokens` for `max_completion_tokens` (reasoning models), with
        # the 400s they send.
        self.refuse_strict = False
        self.refuse_max_tokens = False
        # Answer GET /props as llama.cpp's server does, with this context size (else 404).
        self.props_n_ctx: int | None = None
        # Where cache hits are reported: OpenAI's prompt_tokens_details.cached_tokens,
        # DeepSeek's prompt_cache_hit_tokens, or llama.cpp's timings.cache_n (older
        # llama-server builds; beside the usage, on the body or the stream's last chunk).
        self.cache_report: Literal["openai", "deepseek", "llama.cpp"] = "openai"
        self.reject_unknown_models = reject_unknown_models
        self.host = host
        self.context_window = context_window
        """Prompt tokens (estimated as in the usage) a chat request may hold; one over it is
        answered 400 ``context_length_exceeded`` before any script item is taken. ``None``:
        no limit. May be set while running."""

        self._lock = threading.Lock()
        self._script: deque[ScriptItem] = deque()
        self._callback: ReplyCallback | None = None
        self._requests: list[RecordedRequest] = []
        self._chat_requests: list[ChatRequest] = []
        self._errors: list[str] = []
        self._prompt_history: dict[str, list[str]] = {}
        self._completion_counter = 0
        self._tool_call_counter = 0
        self._fault_probability = 0.0
        self._fault_kinds: list[str] = []
        self._fault_rng = random.Random(0)
        self._faults_injected: list[str] = []

        self._app = Starlette(routes=[Route("/{path:path}", self._dispatch, methods=_HTTP_METHODS)])
        # tls: (certificate file, key file) to serve HTTPS, as a real provider does.
        self._http = LoopbackServer(self._app, name="FakeOpenAIServer", host=host, tls=tls)

    # ---------------------------------------------------------------- lifecycle

    @property
    def port(self) -> int:
        return self._http.port

    @property
    def url(self) -> str:
        """Base URL for the openai client, e.g. ``http://127.0.0.1:PORT/v1``."""
        return f"{self._http.url}/v1"

    @property
    def base_url(self) -> str:
        return self.url

    @property
    def running(self) -> bool:
        return self._http.running

    # ---------------------------------------------------------------- scripting

    def script(self, *replies: ScriptItem) -> None:
        """Queue replies, consumed one per chat-completion request in order.

        Items may be a ``Reply``, a plain string (shorthand for ``Reply(content=...)``) or a
        one-shot callback ``(ChatRequest) -> Reply | str`` (sync or async).
        """
        with self._lock:
            self._script.extend(replies)

    def respond_with(self, callback: ReplyCallback | None) -> None:
        """Set (or clear with ``None``) the callback used when the script queue is empty."""
        with self._lock:
            self._callback = callback

    def inject_faults(
        self, probability: float, *, seed: int = 0, kinds: Sequence[str] | None = None
    ) -> None:
        """Answer each chat request, with ``probability``, by a random fault of ``kinds``
        (default: every fault but ``slow``) instead of its scripted or computed reply,
        which then answers the next request. ``probability=0`` turns it off."""
        chosen = list(kinds if kinds is not None else [k for k in FAULTS if k != "slow"])
        for kind in chosen:
            fault(kind)
        with self._lock:
            self._fault_probability = probability
            self._fault_kinds = chosen
            self._fault_rng = random.Random(seed)

    @property
    def faults_injected(self) -> list[str]:
        """The faults ``inject_faults`` answered with, in order."""
        with self._lock:
            return list(self._faults_injected)

    @property
    def pending_replies(self) -> int:
        with self._lock:
            return len(self._script)

    def assert_all_consumed(self) -> None:
        pending = self.pending_replies
        assert pending == 0, f"fake server: {pending} scripted reply(ies) were never requested"

    def reset(self) -> None:
        """Clear script, callback, request log, errors and the prefix cache."""
        with self._lock:
            self._script.clear()
            self._callback = None
            self._requests.clear()
            self._chat_requests.clear()
            self._errors.clear()
            self._prompt_history.clear()

    def clear_cache(self) -> None:
        with self._lock:
            self._prompt_history.clear()

    # ---------------------------------------------------------------- inspection

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every HTTP request received, in arrival order (a snapshot copy of the list)."""
        with self._lock:
            return list(self._requests)

    @property
    def chat_requests(self) -> list[ChatRequest]:
        """Every well-formed, authorized chat-completion request, parsed."""
        with self._lock:
            return list(self._chat_requests)

    @property
    def errors(self) -> list[str]:
        """Server-side problems: unscripted requests, callback exceptions."""
        with self._lock:
            return list(self._errors)

    def all_request_text(self) -> str:
        """Every raw request body received, joined with newlines (bodies only; JSON-escaped as
        sent - use ``assert_never_saw`` for non-ASCII or escaped secrets)."""
        with self._lock:
            return "\n".join(r.body_text for r in self._requests)

    def saw(self, secret: str) -> bool:
        return bool(self._find(secret))

    def assert_never_saw(self, secret: str) -> None:
        """Fail if ``secret`` appears in any request's body (raw, JSON-escaped or inside a
        decoded JSON string), header value, path or query string."""
        hits = self._find(secret)
        if hits:
            masked = secret[:4] + "..." if len(secret) > 4 else "***"
            raise AssertionError(f"fake server saw secret {masked!r} in: " + "; ".join(hits[:10]))

    def _find(self, secret: str) -> list[str]:
        if not secret:
            raise ValueError("secret must be non-empty")
        needles = {
            secret,
            json.dumps(secret)[1:-1],
            json.dumps(secret, ensure_ascii=False)[1:-1],
        }
        hits: list[str] = []
        for i, rec in enumerate(self.requests):
            where = f"request #{i} {rec.method} {rec.path}"
            if any(n in rec.body_text for n in needles) or _json_contains(rec.json_body, secret):
                hits.append(f"{where} body")
            for name, value in rec.headers.items():
                if secret in value:
                    hits.append(f"{where} header {name}")
            if secret in rec.path or secret in rec.query:
                hits.append(f"{where} url")
        return hits

    def estimate_tokens(self, text: str) -> int:
        return math.ceil(len(text) / self.chars_per_token)

    @staticmethod
    def prompt_text(messages: Sequence[Mapping[str, Any]], tools: Sequence[Any]) -> str:
        """The text prompt tokens and prefix caching are computed over."""
        return "\n".join([_canonical(list(tools)), *(_canonical(dict(m)) for m in messages)])

    # ---------------------------------------------------------------- clients

    def openai_client(self, **kwargs: Any) -> openai.OpenAI:
        """An ``openai.OpenAI`` pointed at this server (``max_retries=0``, ``timeout=30``
        unless overridden)."""
        kwargs.setdefault("max_retries", 0)
        kwargs.setdefault("timeout", 30.0)
        kwargs.setdefault("api_key", self.api_key or "unused")
        return openai.OpenAI(base_url=self.url, **kwargs)

    def async_openai_client(self, **kwargs: Any) -> openai.AsyncOpenAI:
        """An ``openai.AsyncOpenAI`` pointed at this server (same defaults)."""
        kwargs.setdefault("max_retries", 0)
        kwargs.setdefault("timeout", 30.0)
        kwargs.setdefault("api_key", self.api_key or "unused")
        return openai.AsyncOpenAI(base_url=self.url, **kwargs)

    # ---------------------------------------------------------------- HTTP handling

    async def _dispatch(self, request: Request) -> Response:
        raw = await request.body()
        body_text = raw.decode("utf-8", errors="replace")
        parsed: Any | None = None
        json_ok = False
        if raw:
            try:
                parsed = json.loads(raw)
                json_ok = True
            except ValueError:
                parsed = None
        record = RecordedRequest(
            method=request.method,
            path=request.url.path,
            query=request.url.query,
            headers={k.lower(): v for k, v in request.headers.items()},
            body_text=body_text,
            json_body=parsed,
            received_at=time.time(),
        )
        with self._lock:
            self._requests.append(record)
        response = await self._handle(request, record, raw, parsed, json_ok)
        record.status = response.status_code
        return response

    async def _handle(
        self,
        request: Request,
        record: RecordedRequest,
        raw: bytes,
        parsed: Any | None,
        json_ok: bool,
    ) -> Response:
        no_retry = {"x-should-retry": "false"}
        if self.api_key is not None:
            auth = request.headers.get("authorization", "")
            if not auth:
                return _error_response(
                    401,
                    "You didn't provide an API key. You need to provide your API key in an "
                    "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
                    code=None,
                    headers=no_retry,
                )
            if auth != f"Bearer {self.api_key}":
                presented = auth.removeprefix("Bearer ").strip()
                shown = presented[:3] + "*" * max(0, min(len(presented) - 3, 8))
                return _error_response(
                    401,
                    f"Incorrect API key provided: {shown}. (fake server)",
                    headers=no_retry,
                )

        path = record.path.rstrip("/") or "/"
        method = record.method
        if path == "/props" and method == "GET" and self.props_n_ctx is not None:
            # llama.cpp's server properties: the context size it was started with.
            return JSONResponse({"default_generation_settings": {"n_ctx": self.props_n_ctx}})
        if path == "/v1/chat/completions" and method == "POST":
            if not json_ok:
                reason = "empty body" if not raw else "invalid JSON"
                return _error_response(
                    400,
                    "We could not parse the JSON body of your request. (HINT: This likely means "
                    "you aren't using your HTTP library correctly. The OpenAI API expects a JSON "
                    f"payload, but what was sent was not valid JSON.) [fake server: {reason}]",
                    headers=no_retry,
                )
            return await self._chat_completions(record, parsed)
        if path == "/v1/models" and method == "GET":
            return JSONResponse(
                {"object": "list", "data": [self._model_obj(m) for m in self.models]}
            )
        if path.startswith("/v1/models/") and method == "GET":
            model_id = path.removeprefix("/v1/models/")
            if model_id in self.models:
                return JSONResponse(self._model_obj(model_id))
            return _error_response(
                404,
                f"The model '{model_id}' does not exist",
                code="model_not_found",
                headers=no_retry,
            )
        return _error_response(
            404,
            f"fake server: unknown endpoint {method} {record.path}",
            code="unknown_url",
            headers=no_retry,
        )

    @staticmethod
    def _model_obj(model_id: str) -> dict[str, Any]:
        return {"id": model_id, "object": "model", "created": 1700000000, "owned_by": "fake"}

    async def _chat_completions(self, record: RecordedRequest, body: Any) -> Response:
        no_retry = {"x-should-retry": "false"}
        if not isinstance(body, dict):
            return _error_response(400, "Request body must be a JSON object.", headers=no_retry)
        model = body.get("model")
        if not isinstance(model, str) or not model:
            return _error_response(
                400, "you must provide a model parameter", param="model", headers=no_retry
            )
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            return _error_response(
                400,
                "'messages' must be an array of message objects.",
                param="messages",
                headers=no_retry,
            )
        tools = body.get("tools") or []
        if not isinstance(tools, list):
            return _error_response(
                400, "'tools' must be an array.", param="tools", headers=no_retry
            )
        refused = self._refused_parameter(body, tools)
        if refused is not None:
            return _error_response(
                400, refused, error_type="invalid_request_error", headers=no_retry
            )
        if self.reject_unknown_models and model not in self.models:
            return _error_response(
                404,
                f"The model `{model}` does not exist or you do not have access to it.",
                code="model_not_found",
                headers=no_retry,
            )

        with self._lock:
            chat = ChatRequest(
                model=model,
                messages=messages,
                tools=tools,
                stream=bool(body.get("stream")),
                body=body,
                headers=record.headers,
                index=len(self._chat_requests),
            )
            self._chat_requests.append(chat)
            window = self.context_window
            prompt_tokens = (
                0 if window is None else self.estimate_tokens(self.prompt_text(messages, tools))
            )
            item: ScriptItem | None = None
            if window is not None and prompt_tokens > window:
                pass  # refused below, before any fault or script item is taken
            elif self._fault_kinds and self._fault_rng.random() < self._fault_probability:
                kind = self._fault_rng.choice(self._fault_kinds)
                self._faults_injected.append(kind)
                item = FAULTS[kind]
            elif self._script:
                item = self._script.popleft()
            callback = self._callback

        if window is not None and prompt_tokens > window:
            return _error_response(
                400,
                f"This model's maximum context length is {window} tokens. However, your "
                f"messages resulted in {prompt_tokens} tokens. Please reduce the length of the "
                "messages.",
                code="context_length_exceeded",
                headers=no_retry,
            )
        if item is None:
            item = callback
        if item is None:
            last = chat.last_user_message()
            preview = (last[:200] + "...") if last and len(last) > 200 else last
            message = (
                "fake server: no scripted reply - call fake.script(...) or "
                f"fake.respond_with(...) (chat request #{chat.index}, model {model!r}, "
                f"last user message: {preview!r})"
            )
            with self._lock:
                self._errors.append(message)
            return _error_response(
                409,
                message,
                error_type="invalid_request_error",
                code="no_script",
                headers=no_retry,
            )

        try:
            reply = await self._resolve(item, chat)
        except Exception as exc:
            message = f"fake server: reply callback raised {type(exc).__name__}: {exc}"
            with self._lock:
                self._errors.append(message)
            return _error_response(500, message, code="callback_error", headers=no_retry)
        record.reply = reply

        if reply.raw_body is not None:
            await self._sleep(self.latency.fixed_ms / 1000.0 + reply.delay_ms / 1000.0)
            return Response(
                reply.raw_body,
                status_code=reply.raw_status,
                media_type=reply.raw_content_type,
                headers=dict(reply.headers),
            )
        if reply.is_error:
            return await self._scripted_error(reply, chat)
        planned = self._plan(reply, chat)
        record.usage = _usage(
            planned.prompt_tokens, planned.completion_tokens, planned.cached_tokens
        )
        headers = {"x-request-id": f"req_{planned.completion_id}", **reply.headers}
        if chat.stream:
            stream_options = body.get("stream_options")
            include_usage = isinstance(stream_options, dict) and bool(
                stream_options.get("include_usage")
            )
            return StreamingResponse(
                self._stream(planned, include_usage),
                media_type="text/event-stream",
                headers={"cache-control": "no-cache", **headers},
            )
        await self._sleep(
            self.latency.total_seconds(planned.prompt_tokens, planned.completion_tokens)
            + reply.delay_ms / 1000.0
        )
        return JSONResponse(self._completion_body(planned), headers=headers)

    async def _resolve(self, item: ScriptItem, chat: ChatRequest) -> Reply:
        result: Any = item
        if callable(item) and not isinstance(item, Reply | str):
            result = item(chat)
            if inspect.isawaitable(result):
                result = await result
        if isinstance(result, str):
            return Reply(content=result)
        if not isinstance(result, Reply):
            raise TypeError(f"reply callback must return Reply or str, got {type(result)!r}")
        return result

    async def _scripted_error(self, reply: Reply, chat: ChatRequest) -> Response:
        status = reply.error_status
        assert status is not None
        await self._sleep(self.latency.fixed_ms / 1000.0 + reply.delay_ms / 1000.0)
        headers = dict(reply.headers)
        if reply.retry_after is not None:
            headers["retry-after"] = f"{reply.retry_after:g}"
        if reply.should_retry is not None:
            headers["x-should-retry"] = "true" if reply.should_retry else "false"
        return _error_response(
            status,
            reply.error_message,
            error_type=reply.error_type,
            code=reply.error_code,
            headers=headers,
        )

    def _refused_parameter(self, body: dict[str, Any], tools: list[Any]) -> str | None:
        """The 400's message for a parameter this server is set to refuse, or None."""
        if self.refuse_strict and any(
            isinstance(t, dict)
            and isinstance(t.get("function"), dict)
            and "strict" in t["function"]
            for t in tools
        ):
            return "Unrecognized request argument supplied: strict"
        if self.refuse_max_tokens and "max_tokens" in body:
            return (
                "Unsupported parameter: 'max_tokens' is not supported with this model. Use "
                "'max_completion_tokens' instead."
            )
        return None

    def _capped(self, reply: Reply, chat: ChatRequest) -> Reply:
        """The reply as a real server writes it under the request's output cap
        (``max_tokens`` / ``max_completion_tokens``): cut where the cap ends, with
        ``finish_reason`` ``length`` (a tool call cut mid-arguments, as servers do)."""
        cap = chat.body.get("max_completion_tokens") or chat.body.get("max_tokens")
        if not isinstance(cap, int) or reply.completion_tokens is not None:
            return reply
        if not self.honour_output_cap:
            return reply
        room = cap * self.chars_per_token
        if len(reply.output_text()) <= room:
            return reply
        content = (reply.content or "")[:room]
        room -= len(content)
        calls: list[ToolCall] = []
        for call in reply.tool_calls:
            if room <= len(call.name):
                break
            arguments = call.arguments_json()[: room - len(call.name)]
            calls.append(replace(call, arguments=arguments))
            room -= len(call.name) + len(arguments)
        return replace(
            reply,
            content=content if reply.content is not None else None,
            tool_calls=tuple(calls),
            finish_reason="length",
            completion_tokens=cap,
        )

    def _plan(self, reply: Reply, chat: ChatRequest) -> _Planned:
        reply = self._capped(reply, chat)
        prompt = self.prompt_text(chat.messages, chat.tools)
        prompt_tokens = (
            reply.prompt_tokens if reply.prompt_tokens is not None else self.estimate_tokens(prompt)
        )
        completion_tokens = (
            reply.completion_tokens
            if reply.completion_tokens is not None
            else self.estimate_tokens(reply.output_text())
        )
        with self._lock:
            history = self._prompt_history.setdefault(chat.model, [])
            if reply.cached_tokens is not None:
                cached = reply.cached_tokens
            elif self.cache_mode == "prefix":
                best = max((_common_prefix_len(p, prompt) for p in history), default=0)
                tokens = best // self.chars_per_token
                cached = min(
                    tokens - tokens % self.cache_block_tokens,
                    prompt_tokens - prompt_tokens % self.cache_block_tokens,
                )
            else:
                cached = 0
            history.append(prompt)
            self._completion_counter += 1
            completion_id = f"chatcmpl-fake{self._completion_counter:06d}"
            tool_call_ids: list[str] = []
            for tc in reply.tool_calls:
                self._tool_call_counter += 1
                tool_call_ids.append(tc.id or f"call_fake_{self._tool_call_counter}")
        return _Planned(
            reply=reply,
            completion_id=completion_id,
            model=reply.model or chat.model,
            created=int(time.time()),
            tool_call_ids=tool_call_ids,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached_tokens=max(0, cached),
        )

    @staticmethod
    def _finish_reason(reply: Reply) -> str:
        if reply.finish_reason is not None:
            return reply.finish_reason
        return "tool_calls" if reply.tool_calls else "stop"

    def _completion_body(self, p: _Planned) -> dict[str, Any]:
        reply = p.reply
        message: dict[str, Any] = {
            "role": "assistant",
            "content": reply.content
            if (reply.content is not None or not reply.tool_calls)
            else None,
            "refusal": None,
            "annotations": [],
        }
        if message["content"] is None and not reply.tool_calls:
            message["content"] = ""
        if reply.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": tc.name, "arguments": tc.arguments_json()},
                }
                for tc, call_id in zip(reply.tool_calls, p.tool_call_ids, strict=True)
            ]
        return {
            "id": p.completion_id,
            "object": "chat.completion",
            "created": p.created,
            "model": p.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": self._finish_reason(reply),
                }
            ],
            **self._usage_fields(p),
            "service_tier": "default",
            "system_fingerprint": "fp_fake",
        }

    def _usage_fields(self, p: _Planned) -> dict[str, Any]:
        """The body's usage (and llama.cpp's timings), as ``cache_report`` says."""
        usage = _usage(p.prompt_tokens, p.completion_tokens, p.cached_tokens)
        if self.cache_report == "openai":
            return {"usage": usage}
        del usage["prompt_tokens_details"], usage["completion_tokens_details"]
        if self.cache_report == "deepseek":
            usage["prompt_cache_hit_tokens"] = p.cached_tokens
            usage["prompt_cache_miss_tokens"] = p.prompt_tokens - p.cached_tokens
            return {"usage": usage}
        timings = {"cache_n": p.cached_tokens, "prompt_n": p.prompt_tokens - p.cached_tokens}
        return {"usage": usage, "timings": {**timings, "predicted_n": p.completion_tokens}}

    async def _stream(self, p: _Planned, include_usage: bool) -> AsyncIterator[bytes]:
        reply = p.reply
        base: dict[str, Any] = {
            "id": p.completion_id,
            "object": "chat.completion.chunk",
            "created": p.created,
            "model": p.model,
            "service_tier": "default",
            "system_fingerprint": "fp_fake",
        }
        if include_usage:
            base["usage"] = None

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return _sse({**base, "choices": [choice]})

        content_pieces = _chunks(reply.content or "", self.stream_chunk_chars)
        arg_pieces = [
            _chunks(tc.arguments_json(), self.stream_chunk_chars) for tc in reply.tool_calls
        ]
        n_pieces = len(content_pieces) + sum(len(a) for a in arg_pieces)
        per_piece = self.latency.completion_seconds(p.completion_tokens) / max(1, n_pieces)

        await self._sleep(
            self.latency.first_token_seconds(p.prompt_tokens) + reply.delay_ms / 1000.0
        )
        first_content = "" if (reply.content is not None or not reply.tool_calls) else None
        yield chunk({"role": "assistant", "content": first_content, "refusal": None})
        for piece in content_pieces:
            await self._sleep(per_piece)
            yield chunk({"content": piece})
        for index, (tc, call_id, pieces) in enumerate(
            zip(reply.tool_calls, p.tool_call_ids, arg_pieces, strict=True)
        ):
            header = {
                "index": index,
                "id": call_id,
                "type": "function",
                "function": {"name": tc.name, "arguments": ""},
            }
            yield chunk({"tool_calls": [header]})
            for piece in pieces:
                await self._sleep(per_piece)
                yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
        yield chunk({}, self._finish_reason(reply))
        if include_usage:
            yield _sse({**base, "choices": [], **self._usage_fields(p)})
        yield b"data: [DONE]\n\n"

    @staticmethod
    async def _sleep(seconds: float) -> None:
        if seconds > 0:
            await asyncio.sleep(seconds)


def _json_contains(value: Any, secret: str) -> bool:
    if isinstance(value, str):
        return secret in value
    if isinstance(value, dict):
        return any(_json_contains(k, secret) or _json_contains(v, secret) for k, v in value.items())
    if isinstance(value, list):
        return any(_json_contains(v, secret) for v in value)
    return False


# --------------------------------------------------------------------------------------------
# pytest fixture
# --------------------------------------------------------------------------------------------


@pytest.fixture
def fake_llm() -> Iterator[FakeOpenAIServer]:
    """A started ``FakeOpenAIServer`` (api key ``FAKE_API_KEY``, model ``FAKE_MODEL``),
    stopped after the test."""
    server = FakeOpenAIServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()
