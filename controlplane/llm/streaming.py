"""One chat completion, streamed: a slow model that is writing is alive, a silent one is not.

A whole-answer timeout cannot tell a dead server from a slow one. A small model on a
laptop's CPU reads a 2,000-token prompt for 20 to 70 seconds and then writes at a few
tokens a second; called with a 120-second timeout it was "unreachable", and each retry
started the prompt over while the server kept writing the abandoned answer. Streamed,
the call waits ``first_token_timeout`` for the answer to start (the prompt's reading) and
then at most ``idle_timeout`` between two chunks, however long the whole answer takes (the
role's ``max_tokens`` bounds that). A call given up is closed, which cancels it on servers
that stop generating when the client goes (llama.cpp, vLLM, Ollama, hosted APIs).

The chunks are put back together as the body a non-streamed call returns, so the one
validation of :func:`controlplane.llm.client.parse` applies to both. Errors are classified
as the non-streamed ones are (:func:`controlplane.llm.client.classify_status` for an HTTP
error before the stream, by the caller; a broken or silent stream is transient).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import httpx
import openai

from controlplane.llm.errors import Transient

__all__ = ["complete"]


async def complete(
    client: openai.AsyncOpenAI,
    *,
    model: str,
    messages: Sequence[Mapping[str, Any]],
    extra: Mapping[str, Any],
    first_token_timeout: float,
    idle_timeout: float,
) -> bytes:
    """The answer, as the JSON body of a non-streamed completion. A silent or broken
    stream raises :class:`Transient`; the openai client's errors before the stream starts
    (an HTTP error answer, no connection) are the caller's to classify, as for a call that
    does not stream."""
    try:
        stream = await asyncio.wait_for(
            client.chat.completions.create(  # type: ignore[call-overload]
                model=model,
                messages=list(messages),
                stream=True,
                stream_options={"include_usage": True},
                # httpx's own read timeout stays out of the way: ours are below.
                timeout=httpx.Timeout(max(first_token_timeout, idle_timeout) + 30, connect=30),
                **extra,
            ),
            first_token_timeout,
        )
    except TimeoutError:
        raise Transient(f"no answer within {first_token_timeout:g}s") from None
    answer = _Assembly()
    try:
        response: httpx.Response = stream.response
        if "text/event-stream" not in response.headers.get("content-type", ""):
            # A server that answers a stream request whole (or a proxy's page): the body is
            # what a non-streamed call gets, and parse judges it the same way.
            try:
                return await asyncio.wait_for(response.aread(), first_token_timeout)
            except TimeoutError:
                raise Transient(f"no answer within {first_token_timeout:g}s") from None
            except httpx.HTTPError as exc:
                raise Transient(f"the answer broke off: {exc}") from exc
        await answer.read(aiter(stream), first_token_timeout, idle_timeout)
    finally:
        with contextlib.suppress(Exception):  # closing is the cancel; nothing to report
            await stream.close()
    return answer.body()


class _Assembly:
    """The chunks of one answer, put back together."""

    def __init__(self) -> None:
        self.started = False
        self.content: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.timings: dict[str, Any] | None = None
        self.model: str | None = None

    async def read(
        self, chunks: AsyncIterator[Any], first_token_timeout: float, idle_timeout: float
    ) -> None:
        while True:
            wait = idle_timeout if self.started else first_token_timeout
            try:
                chunk = await asyncio.wait_for(anext(chunks), wait)
            except StopAsyncIteration:
                return
            except TimeoutError:
                said = "the answer fell silent for" if self.started else "no token within"
                raise Transient(f"{said} {wait:g}s (the call was abandoned)") from None
            except (openai.OpenAIError, httpx.HTTPError, ValueError) as exc:
                raise Transient(f"the answer's stream broke: {exc}") from exc
            self.take(chunk)

    def take(self, chunk: Any) -> None:
        self.model = self.model or getattr(chunk, "model", None)
        usage = getattr(chunk, "usage", None)
        if usage is not None:
            self.usage = usage.model_dump()
        timings = getattr(chunk, "timings", None)  # llama.cpp's, with its cache hits
        if isinstance(timings, dict):
            self.timings = timings
        for choice in getattr(chunk, "choices", None) or ():
            if getattr(choice, "index", 0) != 0:
                continue
            self.started = True
            delta = choice.delta
            if delta is not None and delta.content:
                self.content.append(delta.content)
            for call in (delta.tool_calls if delta is not None else None) or ():
                self._take_call(call)
            if choice.finish_reason:
                self.finish_reason = choice.finish_reason

    def _take_call(self, call: Any) -> None:
        slot = self.calls.setdefault(
            call.index if isinstance(call.index, int) else len(self.calls),
            {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
        )
        if call.id:
            slot["id"] = call.id
        function = call.function
        if function is not None:
            if function.name:
                slot["function"]["name"] += function.name
            if function.arguments:
                slot["function"]["arguments"] += function.arguments

    def body(self) -> bytes:
        """The answer as a non-streamed completion's body (parse checks it field by field)."""
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(self.content) if self.content or not self.calls else None,
        }
        if self.calls:
            message["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        choice = {"index": 0, "message": message, "finish_reason": self.finish_reason}
        out: dict[str, Any] = {"object": "chat.completion", "model": self.model, "choices": []}
        if self.started:
            out["choices"] = [choice]
        if self.usage is not None:
            out["usage"] = self.usage
        if self.timings is not None:
            out["timings"] = self.timings
        return json.dumps(out).encode()
