"""The one boundary between the control plane and a model: a call in, an answer or a class out.

:meth:`LlmClient.complete` makes one chat-completion call with the official ``openai``
client and returns an :class:`Answer` whose every field has been checked, or raises one of
the classes of :mod:`controlplane.llm.errors`. Transient failures are retried here, with
backoff and jitter (honouring ``Retry-After``), a bounded number of times. Every attempt is
a row in ``llm_calls`` with its outcome class, and a text answer longer than
``llm.max_text_bytes`` is cut and spilled to a blob before the caller sees it.

This module must not decide what a failure means for a turn or a round: callers do.
"""

from __future__ import annotations

import asyncio
import dataclasses
import email.utils
import hashlib
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

import asyncpg
import openai

from controlplane.llm import sessions, streaming, text_calls
from controlplane.llm.adapt import Adaptations
from controlplane.llm.errors import (
    ContextExceeded,
    LlmError,
    Malformed,
    Outcome,
    Permanent,
    Transient,
)
from controlplane.llm.prices import PRECISION, PriceBook
from controlplane.llm.profiles import Windows
from controlplane.llm.transcript import canonical_arguments
from controlplane.settings import LlmSettings
from controlplane.tickets import store
from superagent_shared import backoff
from superagent_shared.ids import new_id

__all__ = [
    "Accounting",
    "Answer",
    "LlmClient",
    "ToolCall",
    "Usage",
    "classify_status",
    "screen_calls",
]

log = logging.getLogger(__name__)

# Wordings of "the prompt does not fit" across providers: OpenAI's code and message (also
# DeepSeek's and Azure's), vLLM's several, Ollama's, llama.cpp's and Anthropic-compatible
# gateways'.
_CONTEXT_MARKERS = (
    "context_length_exceeded",
    "maximum context length",
    "context length exceeded",
    "context window",
    "exceeds the context",
    "exceeds the available context",
    "input length exceeds",
    "is too long to fit into the model",
    "is too long and exceeds limit",
    "longer than the maximum model length",
    "prompt is too long",
    "too many tokens",
    "reduce the length of the messages",
)
_RETRIED_STATUSES = frozenset({408, 425, 429})
MAX_CALLS_PER_ANSWER = 32  # tool calls of one answer that run; the rest are refused


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # as the model wrote it: checking it is the tool's business
    # How the model made it (:mod:`controlplane.llm.text_calls`): native, or written in the
    # text (tagged, fenced, bare, list); on record with the call, never sent to a provider.
    form: str = text_calls.NATIVE
    problem: str | None = None  # why it must not run (a call in the text that was unreadable)


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


@dataclass(frozen=True)
class Answer:
    """A validated assistant message."""

    llm_call_id: str
    content: str | None
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str | None
    usage: Usage
    spilled_blob_id: str | None = None  # where the whole text is, when it was cut
    cost_usd: Decimal = Decimal(0)  # at its model's prices (controlplane.llm.prices)

    def message(self) -> dict[str, Any]:
        """The assistant message, in the shape the conversation stores and replays."""
        out: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                | ({} if call.form == text_calls.NATIVE else {"form": call.form})
                for call in self.tool_calls
            ]
        return out


@dataclass(frozen=True)
class Accounting:
    """Who pays for a call, for its ``llm_calls`` row and the session's and ticket's totals."""

    session_id: str | None
    ticket_id: str | None = None
    batch_size: int = 1
    prompt_version_id: str | None = None
    policy_version_id: str | None = None


class LlmClient:
    """Calls one OpenAI-compatible endpoint for the router, the workers and the watchdog."""

    def __init__(
        self, pool: asyncpg.Pool, client: openai.AsyncOpenAI, settings: LlmSettings | None = None
    ) -> None:
        self.pool = pool
        self.settings = settings or LlmSettings()
        # The retry policy is ours: the official client's own retries would hide attempts
        # from llm_calls and ignore our bound.
        self.client = client.with_options(max_retries=0)
        self.adaptations = Adaptations()
        self.windows = Windows(self.client)
        self.prices = PriceBook(self.settings.prices)

    async def context_tokens(self, model: str, role: Literal["router", "worker"]) -> int:
        """The context window ``role`` works with for ``model`` (the operator's setting,
        else what the server serves, else what is known of the model:
        :mod:`controlplane.llm.profiles`)."""
        name = f"{role}_context_tokens"
        value: int = getattr(self.settings, name)
        configured = value if name in self.settings.model_fields_set else None
        return await self.windows.window(model, configured, value)

    async def complete(
        self,
        *,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        accounting: Accounting,
        tools: Sequence[Any] | None = None,
        max_tokens: int | None = None,
    ) -> Answer:
        """One answer, after at most ``llm.attempts`` tries; raises an :class:`LlmError`.
        ``max_tokens``: the answer's output cap (each role sets its own: a runaway
        generation on a slow local model otherwise runs for many minutes)."""
        attempt = 0
        while True:
            attempt += 1
            llm_call_id = new_id("llm")
            started = time.monotonic()
            extra = self.adaptations.request(model, tools, max_tokens)
            try:
                answer = await self._attempt(llm_call_id, model, messages, tools, extra)
            except LlmError as exc:
                exc.llm_call_id = llm_call_id
                await self._record(
                    llm_call_id, model, accounting, started, Usage(), exc.outcome, str(exc)
                )
                if self.adaptations.learn(model, exc, extra):
                    attempt -= 1  # (learnt once per refusal: the loop still ends)
                    continue
                if not isinstance(exc, Transient) or attempt >= self.settings.attempts:
                    raise
                if not exc.retry:
                    raise  # the provider said not now (x-should-retry: false)
                wait = backoff.delay(
                    attempt,
                    base=self.settings.retry_base_seconds,
                    cap=self.settings.retry_cap_seconds,
                )
                if exc.retry_after is not None:
                    wait = max(wait, min(exc.retry_after, self.settings.retry_cap_seconds))
                log.info("llm: %s (attempt %d); retrying in %.1fs", exc, attempt, wait)
                await asyncio.sleep(wait)
                continue
            answer = await self._spill(answer)
            dollars = await self._record(
                llm_call_id, model, accounting, started, answer.usage, "ok", None
            )
            return dataclasses.replace(answer, cost_usd=dollars)

    async def _attempt(
        self,
        llm_call_id: str,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Any] | None,
        extra: Mapping[str, Any],
    ) -> Answer:
        try:
            if self.settings.stream:
                body = await streaming.complete(
                    self.client,
                    model=model,
                    messages=_wire(messages),
                    extra=extra,
                    first_token_timeout=self.settings.timeout_seconds,
                    idle_timeout=self.settings.idle_timeout_seconds,
                )
            else:
                raw = await self.client.chat.completions.with_raw_response.create(
                    model=model,
                    messages=_wire(messages),  # type: ignore[arg-type]
                    timeout=self.settings.timeout_seconds,
                    **extra,
                )
                body = raw.http_response.content
        except openai.APIStatusError as exc:
            raise classify_status(exc.status_code, _error_text(exc), exc.response.headers) from exc
        except openai.APITimeoutError as exc:
            raise Transient(f"no answer within {self.settings.timeout_seconds:g}s") from exc
        except openai.APIConnectionError as exc:
            raise Transient(f"cannot reach the model: {exc}") from exc
        except openai.OpenAIError as exc:  # anything else the client may raise on a body
            raise Transient(f"{type(exc).__name__}: {exc}") from exc
        return parse(llm_call_id, body, _tool_names(tools))

    async def _spill(self, answer: Answer) -> Answer:
        """A text answer over the limit: its head inline, the whole of it in a blob."""
        limit = self.settings.max_text_bytes
        text = answer.content
        if text is None:
            return answer
        data = text.encode()
        if len(data) <= limit:
            return answer
        blob_id = new_id("blb")
        await self.pool.execute(
            "INSERT INTO blobs (id, content_type, size, sha256, data) VALUES ($1, $2, $3, $4, $5)",
            blob_id,
            "text/plain; charset=utf-8",
            len(data),
            hashlib.sha256(data).hexdigest(),
            data,
        )
        head = data[:limit].decode("utf-8", errors="ignore")
        # The note first, so that whoever shortens the text further keeps the pointer.
        note = (
            f"[cut: this answer was {len(data):,} bytes; the first {len(head.encode()):,} "
            f"follow, the whole of it is in blob {blob_id}]\n\n"
        )
        log.warning("llm: a %d-byte answer was cut and spilled to %s", len(data), blob_id)
        return Answer(
            answer.llm_call_id,
            note + head,
            answer.tool_calls,
            answer.finish_reason,
            answer.usage,
            blob_id,
        )

    async def _record(
        self,
        llm_call_id: str,
        model: str,
        accounting: Accounting,
        started: float,
        usage: Usage,
        outcome: Outcome,
        error: str | None,
    ) -> Decimal:
        """The attempt on record, and its tokens on the session's and the ticket's totals;
        what it cost, at its model's prices."""
        dollars = self.prices.cost(
            model, usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens
        ).quantize(PRECISION)
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "INSERT INTO llm_calls (id, session_id, model, prompt_tokens, completion_tokens, "
                "cached_tokens, latency_ms, batch_size, cost_usd, error, outcome, "
                "prompt_version_id, policy_version_id) "
                "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
                llm_call_id,
                accounting.session_id,
                model,
                usage.prompt_tokens,
                usage.completion_tokens,
                usage.cached_tokens,
                int((time.monotonic() - started) * 1000),
                accounting.batch_size,
                dollars,
                error[:2000] if error else None,
                outcome,
                accounting.prompt_version_id,
                accounting.policy_version_id,
            )
            if not (usage.prompt_tokens or usage.completion_tokens):
                return dollars
            if accounting.session_id is not None:
                await sessions.charge(
                    conn,
                    accounting.session_id,
                    usage.prompt_tokens,
                    usage.completion_tokens,
                    usage.cached_tokens,
                    dollars,
                )
            if accounting.ticket_id is not None:
                await store.add_usage(
                    conn,
                    accounting.ticket_id,
                    usage.prompt_tokens + usage.completion_tokens,
                    dollars,
                )
        return dollars


def screen_calls(
    calls: Sequence[ToolCall], limit: int = MAX_CALLS_PER_ANSWER
) -> list[tuple[ToolCall, str | None]]:
    """Each call of one answer, with why it must not run (None: run it).

    A model that repeats the same call many times in one answer (a loop in its sampling)
    gets it run once; calls beyond ``limit`` are not run. Every call still gets a result,
    as the API requires, so the model reads why.
    """
    seen: dict[tuple[str, str], str] = {}
    out: list[tuple[ToolCall, str | None]] = []
    for index, call in enumerate(calls):
        key = (call.name, canonical_arguments(call.arguments))
        if call.problem is not None:
            out.append((call, call.problem))
        elif key in seen:
            out.append((call, f"not run: the same call as {seen[key]} in this answer"))
        elif index >= limit:
            out.append((call, f"not run: more than {limit} tool calls in one answer"))
        else:
            seen[key] = call.id
            out.append((call, None))
    return out


def classify_status(status: int, text: str, headers: Mapping[str, str]) -> LlmError:
    """The class of an HTTP error answer."""
    lowered = text.lower()
    if any(marker in lowered for marker in _CONTEXT_MARKERS):
        return ContextExceeded(text, status=status)
    if status in _RETRIED_STATUSES or status >= 500:
        if "insufficient_quota" in lowered:
            return Permanent(text, status=status)  # billing, not load: waiting will not help
        return Transient(
            text,
            status=status,
            retry_after=_retry_after(headers),
            retry=headers.get("x-should-retry", "").lower() != "false",
        )
    return Permanent(text, status=status)


def parse(llm_call_id: str, body: bytes, offered: Sequence[str] = ()) -> Answer:
    """A 200's body, checked field by field; a body that is not JSON is a proxy's, transient.

    With tools ``offered`` (their names) and no native call, calls the model wrote in its
    text are read (:mod:`controlplane.llm.text_calls`) and become the answer's calls."""
    try:
        data = json.loads(body)
    except ValueError:
        preview = body[:120].decode("utf-8", errors="replace")
        raise Transient(f"the answer is not JSON: {preview!r}", status=200) from None
    if not isinstance(data, dict):
        raise Transient(f"the answer is not a JSON object but {type(data).__name__}", status=200)
    if "error" in data and not data.get("choices"):
        # Some gateways wrap a provider's error in a 200.
        error = data["error"]
        text = json.dumps(error) if not isinstance(error, str) else error
        code = error.get("code") if isinstance(error, dict) else None
        raise classify_status(code if isinstance(code, int) else 503, text, {})
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        raise Malformed("the answer has no choices")
    choice = choices[0]
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        raise Malformed("the answer's message is null")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise Malformed(f"the answer's content is {type(content).__name__}, not text")
    finish_reason = choice.get("finish_reason")
    finish_reason = finish_reason if isinstance(finish_reason, str) else None
    calls = _tool_calls(message.get("tool_calls"))
    if finish_reason == "length" and calls:
        for call in calls:
            try:
                json.loads(call.arguments or "{}")
            except ValueError:
                raise Malformed(
                    "the answer was cut off (finish_reason=length) in the middle of its "
                    f"{call.name} call"
                ) from None
    if not calls and offered and content:
        content, calls = _written_calls(llm_call_id, content, offered)
    if content is None and not calls:
        content = ""
    return Answer(
        llm_call_id, content, calls, finish_reason, _usage(data.get("usage"), data.get("timings"))
    )


def _written_calls(
    llm_call_id: str, content: str, offered: Sequence[str]
) -> tuple[str | None, tuple[ToolCall, ...]]:
    """The calls written in ``content`` and the prose left around them; an unreadable one is
    one call that does not run (its ``problem`` is what the model is told), the whole text
    kept. Ids are unique in a session (the call's id in them), as a tool result needs."""
    reading = text_calls.read(content, offered)
    if reading is None:
        return content, ()
    stem = f"text_call_{{}}_{llm_call_id.removeprefix('llm_')}"
    if reading.problem is not None:
        return reading.content, (
            ToolCall(
                stem.format(0),
                reading.about or "tool_call",
                "{}",
                text_calls.UNREADABLE,
                reading.problem,
            ),
        )
    log.info(
        "llm: %d tool call(s) read from the text (%s)",
        len(reading.calls),
        ", ".join(sorted({call.form for call in reading.calls})),
    )
    return reading.content, tuple(
        ToolCall(stem.format(index), call.name, call.arguments, call.form)
        for index, call in enumerate(reading.calls)
    )


def _tool_names(tools: Sequence[Any] | None) -> list[str]:
    """The names of the tools offered (OpenAI function specs)."""
    names = []
    for tool in tools or ():
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(function, Mapping) and isinstance(function.get("name"), str):
            names.append(function["name"])
    return names


def _wire(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The messages as a provider takes them: a call's ``form`` is our record, and a strict
    API refuses a key it does not know."""
    out: list[Mapping[str, Any]] = []
    for message in messages:
        calls = message.get("tool_calls")
        if isinstance(calls, list) and any(isinstance(c, dict) and "form" in c for c in calls):
            message = {
                **message,
                "tool_calls": [
                    {k: v for k, v in c.items() if k != "form"} if isinstance(c, dict) else c
                    for c in calls
                ],
            }
        out.append(message)
    return out


def _tool_calls(value: Any) -> tuple[ToolCall, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise Malformed("the answer's tool_calls is not a list")
    calls = []
    for index, item in enumerate(value):
        function = item.get("function") if isinstance(item, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise Malformed(f"tool call {index} has no function name")
        if item.get("type", "function") != "function":
            continue
        arguments = function.get("arguments")
        if isinstance(arguments, dict):
            arguments = json.dumps(arguments)  # some servers send an object, not its text
        elif not isinstance(arguments, str):
            arguments = "" if arguments is None else str(arguments)
        call_id = item.get("id")
        calls.append(
            ToolCall(
                call_id if isinstance(call_id, str) and call_id else f"call_{index}",
                function["name"],
                arguments,
            )
        )
    return tuple(calls)


def _usage(value: Any, timings: Any = None) -> Usage:
    if not isinstance(value, dict):
        return Usage()
    return Usage(
        _count(value.get("prompt_tokens")),
        _count(value.get("completion_tokens")),
        _cached(value, timings),
    )


def _cached(usage: dict[str, Any], timings: Any) -> int:
    """The prompt tokens the server served from its cache, in whichever field it reports
    them: ``prompt_tokens_details.cached_tokens`` (OpenAI, vLLM, newer llama.cpp),
    ``prompt_cache_hit_tokens`` (DeepSeek), or llama.cpp's ``timings.cache_n`` beside the
    usage. Never more than the prompt."""
    details = usage.get("prompt_tokens_details")
    found = _count(details.get("cached_tokens")) if isinstance(details, dict) else 0
    found = found or _count(usage.get("prompt_cache_hit_tokens"))
    if not found and isinstance(timings, dict):
        found = _count(timings.get("cache_n"))
    return min(found, _count(usage.get("prompt_tokens")))


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _error_text(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict):
            parts = [str(error.get(key)) for key in ("code", "type") if error.get(key)]
            message = str(error.get("message") or "")
            return f"{exc.status_code} {' '.join(parts)}: {message}".strip()
    return f"{exc.status_code}: {exc.message}"


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds from ``retry-after-ms`` or ``retry-after`` (seconds or an HTTP date)."""
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            return max(0.001, float(millis) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.001, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.001, when.timestamp() - time.time())
