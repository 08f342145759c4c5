"""A model's speed against the boundary's patience, as a small local model showed it.

Qwen2.5-Coder 1.5B on a 2-core machine (llama.cpp) reads the router's 2,100-token prompt
for 20 to 70 s, then writes a few tokens a second: a whole-answer timeout of 120 s called
it "unreachable", and each retry started over while the server kept writing the abandoned
answer. One generation ran to 1,831 tokens (eight minutes) for a step that needed a few
dozen. Over the real wire protocol (the fake OpenAI server streams SSE, honours the output
cap and keeps its own clock): a model that keeps writing is alive however long it takes,
a silent one is given up and its call closed, and every role caps its output.
"""

from __future__ import annotations

import time
from typing import Literal

import asyncpg
import pytest

from controlplane.llm import Accounting, LlmClient, LlmError
from controlplane.settings import LlmSettings
from tests.fakes.openai_server import FAKE_MODEL, FakeOpenAIServer, LatencyModel, Reply, ToolCall

HELLO = [{"role": "user", "content": "hello"}]
# Seconds, kept short: each case is seen in a few seconds.
PATIENCE = {"timeout_seconds": 1.0, "idle_timeout_seconds": 1.0, "attempts": 1}


async def _outcomes(pool: asyncpg.Pool) -> list[str]:
    rows = await pool.fetch("SELECT outcome FROM llm_calls ORDER BY created_at, id")
    return [row["outcome"] for row in rows]


async def test_a_slow_model_that_keeps_writing_is_not_called_unreachable(
    pool: asyncpg.Pool, fake_llm: FakeOpenAIServer
) -> None:
    # About 4 s to write the answer, a token every 20 ms: four times the patience in all,
    # never silent for long.
    text = "Counting slowly: " + " ".join(str(i) for i in range(400))
    fake_llm.latency = LatencyModel(fixed_ms=300, per_completion_token_ms=20)
    fake_llm.script(Reply(content=text))
    client = LlmClient(pool, fake_llm.async_openai_client(), LlmSettings(**PATIENCE))
    started = time.monotonic()
    answer = await client.complete(model=FAKE_MODEL, messages=HELLO, accounting=Accounting(None))
    assert answer.content == text
    assert time.monotonic() - started > 2 * PATIENCE["timeout_seconds"]
    assert await _outcomes(pool) == ["ok"]
    (request,) = fake_llm.chat_requests
    assert request.body["stream"] is True


async def test_a_model_that_says_nothing_is_given_up_at_its_timeout(
    pool: asyncpg.Pool, fake_llm: FakeOpenAIServer
) -> None:
    fake_llm.script(Reply(content="too late", delay_ms=20_000))
    client = LlmClient(pool, fake_llm.async_openai_client(), LlmSettings(**PATIENCE))
    started = time.monotonic()
    with pytest.raises(LlmError) as raised:
        await client.complete(model=FAKE_MODEL, messages=HELLO, accounting=Accounting(None))
    assert time.monotonic() - started < 10
    assert raised.value.outcome == "transient"
    assert "within 1s" in str(raised.value)


async def test_a_runaway_generation_is_cut_at_the_callers_output_cap(
    pool: asyncpg.Pool, fake_llm: FakeOpenAIServer
) -> None:
    fake_llm.script(Reply(content="word " * 5000))  # about 6,000 tokens, unasked
    client = LlmClient(pool, fake_llm.async_openai_client(), LlmSettings(**PATIENCE))
    answer = await client.complete(
        model=FAKE_MODEL, messages=HELLO, accounting=Accounting(None), max_tokens=64
    )
    assert answer.finish_reason == "length"
    assert answer.usage.completion_tokens == 64
    assert answer.content is not None
    assert len(answer.content) <= 64 * fake_llm.chars_per_token
    (request,) = fake_llm.chat_requests
    assert request.body["max_tokens"] == 64


async def test_a_call_cut_by_the_output_cap_mid_arguments_is_malformed_not_run(
    pool: asyncpg.Pool, fake_llm: FakeOpenAIServer
) -> None:
    fake_llm.script(Reply(tool_calls=[ToolCall("shell", {"command": "echo " + "x" * 4000})]))
    client = LlmClient(pool, fake_llm.async_openai_client(), LlmSettings(**PATIENCE))
    with pytest.raises(LlmError) as raised:
        await client.complete(
            model=FAKE_MODEL, messages=HELLO, accounting=Accounting(None), max_tokens=32
        )
    assert raised.value.outcome == "malformed"
    assert "cut off" in str(raised.value)


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "shell",
            "description": "run a command",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
                "additionalProperties": False,
            },
            "strict": True,
        },
    }
]


async def test_a_server_without_strict_schemas_gets_them_loose_and_the_call_still_works(
    pool: asyncpg.Pool, fake_llm: FakeOpenAIServer
) -> None:
    fake_llm.refuse_strict = True
    fake_llm.script(Reply(tool_calls=[ToolCall("shell", {"command": "ls"})]), Reply("done"))
    client = LlmClient(pool, fake_llm.async_openai_client(), LlmSettings(**PATIENCE))
    for _ in range(2):
        await client.complete(
            model=FAKE_MODEL, messages=HELLO, accounting=Accounting(None), tools=TOOLS
        )
    bodies = [r.json_body for r in fake_llm.requests if r.path.endswith("/chat/completions")]
    sent = [[t["function"].get("strict") for t in b["tools"]] for b in bodies if b]
    # Refused once, then loose for this model: the next call does not ask again.
    assert sent == [[True], [None], [None]]
    assert await _outcomes(pool) == ["permanent", "ok", "ok"]


async def test_a_model_that_wants_max_completion_tokens_gets_its_cap_by_that_name(
    pool: asyncpg.Pool, fake_llm: FakeOpenAIServer
) -> None:
    fake_llm.refuse_max_tokens = True
    fake_llm.script(Reply(content="word " * 500))
    client = LlmClient(pool, fake_llm.async_openai_client(), LlmSettings(**PATIENCE))
    answer = await client.complete(
        model=FAKE_MODEL, messages=HELLO, accounting=Accounting(None), max_tokens=16
    )
    assert answer.finish_reason == "length"
    last = fake_llm.chat_requests[-1].body
    assert (last.get("max_tokens"), last.get("max_completion_tokens")) == (None, 16)


async def test_the_window_is_the_servers_unless_the_operator_set_one(
    pool: asyncpg.Pool, fake_llm: FakeOpenAIServer
) -> None:
    """A local server started with --ctx-size 8192 answered prompts past it with a 400
    while the settings said 128,000: the window a role compacts within is the one the
    server serves (llama.cpp's /props), unless the operator said otherwise."""
    fake_llm.props_n_ctx = 8192
    served = LlmClient(pool, fake_llm.async_openai_client(), LlmSettings(**PATIENCE))
    assert await served.context_tokens(FAKE_MODEL, "router") == 8192
    assert await served.context_tokens(FAKE_MODEL, "worker") == 8192
    chosen = LlmSettings(**PATIENCE, router_context_tokens=6000)
    told = LlmClient(pool, fake_llm.async_openai_client(), chosen)
    assert await told.context_tokens(FAKE_MODEL, "router") == 6000
    assert await told.context_tokens(FAKE_MODEL, "worker") == 8192
    fake_llm.props_n_ctx = None  # a server that says nothing: the model's known window
    assert (
        await LlmClient(pool, fake_llm.async_openai_client()).context_tokens(
            "qwen2.5-coder-1.5b-instruct", "router"
        )
        == 32_768
    )
    assert (
        await LlmClient(pool, fake_llm.async_openai_client()).context_tokens(FAKE_MODEL, "router")
        == LlmSettings().router_context_tokens
    )


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("report", ["openai", "deepseek", "llama.cpp"])
async def test_cache_hits_are_counted_in_whichever_field_the_server_reports_them(
    pool: asyncpg.Pool,
    fake_llm: FakeOpenAIServer,
    report: Literal["openai", "deepseek", "llama.cpp"],
    stream: bool,
) -> None:
    """OpenAI and vLLM say ``prompt_tokens_details.cached_tokens``, DeepSeek
    ``prompt_cache_hit_tokens``, older llama.cpp builds ``timings.cache_n`` beside the
    usage: each is the share of the prompt served from the cache, on record per call."""
    fake_llm.cache_report = report
    fake_llm.script(Reply(content="ok", prompt_tokens=2000, cached_tokens=1900))
    client = LlmClient(pool, fake_llm.async_openai_client(), LlmSettings(**PATIENCE, stream=stream))
    answer = await client.complete(model=FAKE_MODEL, messages=HELLO, accounting=Accounting(None))
    assert (answer.usage.prompt_tokens, answer.usage.cached_tokens) == (2000, 1900)
    recorded = await pool.fetchrow("SELECT prompt_tokens, cached_tokens FROM llm_calls")
    assert recorded is not None
    assert (recorded["prompt_tokens"], recorded["cached_tokens"]) == (2000, 1900)
