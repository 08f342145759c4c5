"""Tests for the fake OpenAI-compatible server, driven through the official ``openai`` client."""

# The fixture is imported into this module's namespace explicitly (no conftest yet), so test
# parameters named ``fake_llm`` "redefine" the import as far as pyflakes is concerned.
# ruff: noqa: F811

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionFunctionToolParam, ChatCompletionMessageParam

from tests.fakes.openai_server import (
    FAKE_API_KEY,
    FAKE_MODEL,
    ChatRequest,
    FakeOpenAIServer,
    LatencyModel,
    Reply,
    ToolCall,
    fake_llm,  # noqa: F401
)

TICKET_TOOL: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {
        "name": "create_ticket",
        "description": "Create a ticket",
        "parameters": {
            "type": "object",
            "properties": {"title": {"type": "string"}, "priority": {"type": "integer"}},
            "required": ["title"],
        },
    },
}


def test_non_streaming_text(fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(Reply(content="hi there"))
    client = openai.OpenAI(base_url=fake_llm.url, api_key=FAKE_API_KEY, max_retries=0)
    resp = client.chat.completions.create(
        model=FAKE_MODEL, messages=[{"role": "user", "content": "hello"}]
    )
    assert resp.choices[0].message.content == "hi there"
    assert resp.choices[0].finish_reason == "stop"
    assert resp.model == FAKE_MODEL
    assert resp.usage is not None
    assert resp.usage.prompt_tokens > 0
    assert resp.usage.completion_tokens == 2  # ceil(len("hi there") / 4)
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    assert resp.usage.prompt_tokens_details is not None
    assert resp.usage.prompt_tokens_details.cached_tokens == 0
    assert fake_llm.url.startswith("http://127.0.0.1:")
    assert fake_llm.url.endswith("/v1")
    fake_llm.assert_all_consumed()


def test_models_endpoint() -> None:
    with FakeOpenAIServer(models=["m-large", "m-small"], api_key=None) as fake:
        client = fake.openai_client()
        assert [m.id for m in client.models.list()] == ["m-large", "m-small"]
        assert client.models.retrieve("m-small").id == "m-small"
    assert not fake.running


def test_tool_call_round_trip(fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(
        Reply(tool_calls=[ToolCall("create_ticket", {"title": "x", "priority": 2})]),
        Reply(content="Created ticket 42."),
    )
    client = fake_llm.openai_client()
    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "file a ticket titled x"}
    ]
    first = client.chat.completions.create(model=FAKE_MODEL, messages=messages, tools=[TICKET_TOOL])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert choice.message.tool_calls is not None
    [call] = choice.message.tool_calls
    assert call.type == "function"
    assert call.function.name == "create_ticket"
    assert json.loads(call.function.arguments) == {"title": "x", "priority": 2}

    messages.append(
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": call.function.arguments},
                }
            ],
        }
    )
    messages.append({"role": "tool", "tool_call_id": call.id, "content": '{"id": 42}'})
    second = client.chat.completions.create(
        model=FAKE_MODEL, messages=messages, tools=[TICKET_TOOL]
    )
    assert second.choices[0].message.content == "Created ticket 42."

    first_req, second_req = fake_llm.chat_requests
    assert first_req.tool_names() == ["create_ticket"]
    [tool_result] = second_req.tool_results()
    assert tool_result["tool_call_id"] == call.id


def test_streaming_tool_calls_reassembled_by_client(fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(
        Reply(
            content="Let me file two tickets.",
            tool_calls=[
                ToolCall("create_ticket", {"title": "first ticket, with a long-ish title"}),
                ToolCall("create_ticket", {"title": "second", "priority": 1}, id="call_abc"),
            ],
        )
    )
    client = fake_llm.openai_client()
    with client.chat.completions.stream(
        model=FAKE_MODEL,
        messages=[{"role": "user", "content": "two tickets please"}],
        tools=[TICKET_TOOL],
    ) as stream:
        event_types = {event.type for event in stream}
        final = stream.get_final_completion()
    assert "content.delta" in event_types
    assert "tool_calls.function.arguments.delta" in event_types
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me file two tickets."
    assert choice.message.tool_calls is not None
    calls = choice.message.tool_calls
    assert [c.function.name for c in calls] == ["create_ticket", "create_ticket"]
    assert calls[1].id == "call_abc"
    assert json.loads(calls[0].function.arguments) == {
        "title": "first ticket, with a long-ish title"
    }
    assert json.loads(calls[1].function.arguments) == {"title": "second", "priority": 1}
    assert fake_llm.chat_requests[0].stream is True


def test_raw_sse_wire_format(fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(Reply(tool_calls=[ToolCall("create_ticket", {"title": "abcdefghijkl"})]))
    resp = httpx.post(
        f"{fake_llm.url}/chat/completions",
        headers={"Authorization": f"Bearer {FAKE_API_KEY}"},
        json={
            "model": FAKE_MODEL,
            "messages": [{"role": "user", "content": "x"}],
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    events = [e for e in resp.text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    header = chunks[1]["choices"][0]["delta"]["tool_calls"][0]
    assert header["index"] == 0
    assert header["type"] == "function"
    assert header["id"].startswith("call_")
    assert header["function"] == {"name": "create_ticket", "arguments": ""}
    args = "".join(
        c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"] for c in chunks[2:-2]
    )
    assert json.loads(args) == {"title": "abcdefghijkl"}
    assert len(chunks[2:-2]) > 1  # arguments really are incremental
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-2]["usage"] is None
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["total_tokens"] > 0


async def test_async_streaming_usage_chunk(fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(Reply(content="streamed answer text"))
    client = openai.AsyncOpenAI(base_url=fake_llm.url, api_key=FAKE_API_KEY, max_retries=0)
    stream = await client.chat.completions.create(
        model=FAKE_MODEL,
        messages=[{"role": "user", "content": "stream please"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    state: ChatCompletionStreamState[None] = ChatCompletionStreamState()
    chunks = []
    async for chunk in stream:
        chunks.append(chunk)
        state.handle_chunk(chunk)
    await client.close()

    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason == "stop"
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    assert usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens == 5  # ceil(20 / 4)
    assert usage_chunk.usage.prompt_tokens_details is not None
    assert usage_chunk.usage.prompt_tokens_details.cached_tokens == 0
    assert all(c.usage is None for c in chunks[:-1])
    assert state.get_final_completion().choices[0].message.content == "streamed answer text"


async def test_async_tool_call_round_trip(fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(Reply(tool_calls=[ToolCall("create_ticket", {"title": "async"})]))
    client = fake_llm.async_openai_client()
    resp = await client.chat.completions.create(
        model=FAKE_MODEL, messages=[{"role": "user", "content": "go"}], tools=[TICKET_TOOL]
    )
    await client.close()
    calls = resp.choices[0].message.tool_calls
    assert calls is not None
    assert calls[0].type == "function"
    assert json.loads(calls[0].function.arguments) == {"title": "async"}


def test_prefix_cache_grows_on_shared_prefix() -> None:
    with FakeOpenAIServer(cache_block_tokens=64) as fake:
        fake.respond_with(lambda req: Reply(content="ok"))
        client = fake.openai_client()
        system = "You are a meticulous coding agent. " * 40  # ~1400 chars, ~350 tokens
        messages: list[ChatCompletionMessageParam] = [
            {"role": "system", "content": system},
            {"role": "user", "content": "first question"},
        ]
        first = client.chat.completions.create(model=FAKE_MODEL, messages=messages)
        messages += [
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "second question"},
        ]
        second = client.chat.completions.create(model=FAKE_MODEL, messages=messages)

    assert first.usage is not None
    assert second.usage is not None
    assert first.usage.prompt_tokens_details is not None
    assert second.usage.prompt_tokens_details is not None
    first_cached = first.usage.prompt_tokens_details.cached_tokens
    second_cached = second.usage.prompt_tokens_details.cached_tokens
    assert first_cached == 0
    assert second_cached is not None
    assert second_cached > 0
    assert second_cached % 64 == 0
    assert second_cached <= first.usage.prompt_tokens
    assert second.usage.prompt_tokens > first.usage.prompt_tokens


def test_cached_tokens_reply_override_and_cache_off() -> None:
    with FakeOpenAIServer(cache_mode="off") as fake:
        fake.script(Reply(content="a"), Reply(content="b", cached_tokens=7))
        client = fake.openai_client()
        msgs: list[ChatCompletionMessageParam] = [{"role": "user", "content": "same " * 400}]
        cached = []
        for _ in range(2):
            usage = client.chat.completions.create(model=FAKE_MODEL, messages=msgs).usage
            assert usage is not None
            assert usage.prompt_tokens_details is not None
            cached.append(usage.prompt_tokens_details.cached_tokens)
    assert cached == [0, 7]


def test_callback_sees_request_messages(fake_llm: FakeOpenAIServer) -> None:
    seen: list[ChatRequest] = []

    def echo(req: ChatRequest) -> Reply:
        seen.append(req)
        return Reply(content=f"echo: {req.last_user_message()} ({len(req.messages)} msgs)")

    fake_llm.respond_with(echo)
    client = fake_llm.openai_client()
    resp = client.chat.completions.create(
        model=FAKE_MODEL,
        messages=[
            {"role": "system", "content": "be terse"},
            {"role": "user", "content": [{"type": "text", "text": "ping"}]},
        ],
        temperature=0.1,
    )
    assert resp.choices[0].message.content == "echo: ping (2 msgs)"
    [req] = seen
    assert req.model == FAKE_MODEL
    assert req.system_prompt() == "be terse"
    assert req.body["temperature"] == 0.1
    assert req.stream is False
    assert req.headers["authorization"] == f"Bearer {FAKE_API_KEY}"


async def test_async_callback_and_scripted_precedence(fake_llm: FakeOpenAIServer) -> None:
    async def compute(req: ChatRequest) -> str:
        return f"computed #{req.index}"

    fake_llm.respond_with(compute)
    fake_llm.script("scripted first")
    client = fake_llm.async_openai_client()
    answers = []
    for _ in range(2):
        resp = await client.chat.completions.create(
            model=FAKE_MODEL, messages=[{"role": "user", "content": "q"}]
        )
        answers.append(resp.choices[0].message.content)
    await client.close()
    assert answers == ["scripted first", "computed #1"]


def test_latency_model_fixed_delay(fake_llm: FakeOpenAIServer) -> None:
    fake_llm.latency = LatencyModel(fixed_ms=200)
    fake_llm.script("slow")
    client = fake_llm.openai_client()
    start = time.perf_counter()
    client.chat.completions.create(model=FAKE_MODEL, messages=[{"role": "user", "content": "x"}])
    assert time.perf_counter() - start >= 0.2


async def test_latency_model_streaming(fake_llm: FakeOpenAIServer) -> None:
    fake_llm.latency = LatencyModel(fixed_ms=100, per_completion_token_ms=10)
    fake_llm.script(Reply(content="y" * 40))  # 10 completion tokens -> +100 ms over the chunks
    client = fake_llm.async_openai_client()
    start = time.perf_counter()
    stream = await client.chat.completions.create(
        model=FAKE_MODEL, messages=[{"role": "user", "content": "x"}], stream=True
    )
    parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
    elapsed = time.perf_counter() - start
    await client.close()
    assert "".join(parts) == "y" * 40
    assert elapsed >= 0.2


def test_request_log_and_canary(fake_llm: FakeOpenAIServer) -> None:
    canary = "CANARY-7f3e9c1d-do-not-leak"
    fake_llm.script("noted")
    client = fake_llm.openai_client()
    client.chat.completions.create(
        model=FAKE_MODEL,
        messages=[{"role": "user", "content": f"remember this token: {canary}"}],
    )
    [rec] = fake_llm.requests
    assert rec.method == "POST"
    assert rec.path == "/v1/chat/completions"
    assert rec.status == 200
    assert rec.usage is not None
    assert isinstance(rec.json_body, dict)
    assert rec.json_body["messages"][0]["content"].endswith(canary)
    assert canary in rec.body_text
    assert canary in fake_llm.all_request_text()
    assert fake_llm.saw(canary)
    with pytest.raises(AssertionError, match="request #0 POST /v1/chat/completions body"):
        fake_llm.assert_never_saw(canary)
    fake_llm.assert_never_saw("some-other-secret")


def test_canary_found_even_when_json_escaped(fake_llm: FakeOpenAIServer) -> None:
    canary = 'sëcret"quoted'
    fake_llm.script("ok")
    fake_llm.openai_client().chat.completions.create(
        model=FAKE_MODEL, messages=[{"role": "user", "content": canary}]
    )
    with pytest.raises(AssertionError):
        fake_llm.assert_never_saw(canary)


def test_wrong_api_key_is_401(fake_llm: FakeOpenAIServer) -> None:
    client = openai.OpenAI(base_url=fake_llm.url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as excinfo:
        client.chat.completions.create(
            model=FAKE_MODEL, messages=[{"role": "user", "content": "x"}]
        )
    assert excinfo.value.status_code == 401
    assert excinfo.value.code == "invalid_api_key"
    assert fake_llm.requests[0].status == 401
    assert fake_llm.chat_requests == []


def test_scripted_429_raises_rate_limit_error(fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(Reply(error_status=429, error_message="rate limited", retry_after=0))
    client = fake_llm.openai_client(max_retries=0)
    with pytest.raises(openai.RateLimitError, match="rate limited") as excinfo:
        client.chat.completions.create(
            model=FAKE_MODEL, messages=[{"role": "user", "content": "x"}]
        )
    assert excinfo.value.response.headers["retry-after"] == "0"
    assert excinfo.value.code == "rate_limit_exceeded"


def test_scripted_429_is_retried_by_client(fake_llm: FakeOpenAIServer) -> None:
    fake_llm.script(Reply(error_status=429, error_message="rate limited", retry_after=0), "ok")
    client = fake_llm.openai_client(max_retries=1)
    resp = client.chat.completions.create(
        model=FAKE_MODEL, messages=[{"role": "user", "content": "x"}]
    )
    assert resp.choices[0].message.content == "ok"
    assert [r.status for r in fake_llm.requests] == [429, 200]


def test_no_script_raises_clear_error(fake_llm: FakeOpenAIServer) -> None:
    # default max_retries: the server sends x-should-retry: false, so no retries happen
    client = openai.OpenAI(base_url=fake_llm.url, api_key=FAKE_API_KEY)
    with pytest.raises(openai.ConflictError, match="no scripted reply") as excinfo:
        client.chat.completions.create(
            model=FAKE_MODEL, messages=[{"role": "user", "content": "unexpected call"}]
        )
    assert excinfo.value.code == "no_script"
    assert len(fake_llm.requests) == 1
    assert "unexpected call" in fake_llm.errors[0]


def test_callback_exception_is_500(fake_llm: FakeOpenAIServer) -> None:
    def broken(req: ChatRequest) -> Reply:
        raise ValueError("boom")

    fake_llm.respond_with(broken)
    client = fake_llm.openai_client()
    with pytest.raises(openai.InternalServerError, match="ValueError: boom"):
        client.chat.completions.create(
            model=FAKE_MODEL, messages=[{"role": "user", "content": "x"}]
        )
    assert "boom" in fake_llm.errors[0]


def test_malformed_json_is_400(fake_llm: FakeOpenAIServer) -> None:
    resp = httpx.post(
        f"{fake_llm.url}/chat/completions",
        headers={"Authorization": f"Bearer {FAKE_API_KEY}", "content-type": "application/json"},
        content=b'{"model": "fake-model", "messages": [',
    )
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "JSON" in error["message"]
    [rec] = fake_llm.requests
    assert rec.json_body is None
    assert rec.body_text.startswith('{"model"')


def test_missing_auth_and_unknown_endpoint(fake_llm: FakeOpenAIServer) -> None:
    resp = httpx.get(f"{fake_llm.url}/models")
    assert resp.status_code == 401
    assert "API key" in resp.json()["error"]["message"]
    resp = httpx.get(f"{fake_llm.url}/nope", headers={"Authorization": f"Bearer {FAKE_API_KEY}"})
    assert resp.status_code == 404
    assert resp.json()["error"]["code"] == "unknown_url"
