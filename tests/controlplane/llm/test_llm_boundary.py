"""The model boundary: every misbehaviour of an OpenAI-compatible endpoint is classified,
recorded with its class, and contained in the turn or round it happened in.

Real parts throughout: the fake OpenAI server over HTTP (with its fault mode), the official
client, a real Postgres, a real router turn under a real RouterService, real worker rounds
under a real WorkerService with a device that runs commands for real.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import openai
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.db.urls import asyncpg_dsn
from controlplane.gateway.queue import CommandQueue
from controlplane.ingest.admission import Admission, SourceAdmission
from controlplane.ingest.intake import Intake
from controlplane.router.router import Router
from controlplane.settings import LlmSettings
from tests.fakes.openai_server import (
    FAKE_MODEL,
    FAULTS,
    ChatRequest,
    FakeOpenAIServer,
    Reply,
    ToolCall,
    fault,
)
from tests.support.helpers import assert_eventually, free_port, save_policy
from tests.support.replica_process import ReplicaProcess, prepare_database, serve_env
from tests.support.router_harness import ALICE, ask, router_running, tickets_for_batch
from tests.support.worker_harness import (  # noqa: F401 - fixtures
    LocalDevice,
    device_fixture,
    dsn_fixture,
    queue_fixture,
    report_reply,
    state_is,
    ticket,
    tool_results,
    workers_running,
)

# Quick retries, a short timeout: each fault is seen in seconds, not minutes.
FAST = {"attempts": 2, "retry_base_seconds": 0.01, "retry_cap_seconds": 2.0, "timeout_seconds": 1.0}
# What each fault is, as the boundary must classify it.
CLASSES = {
    "empty_choices": "malformed",
    "null_message": "malformed",
    "html_200": "transient",
    "rate_limited": "transient",
    "server_error": "transient",
    "bad_gateway": "transient",
    "unavailable": "transient",
    "context_length": "context",
    "unauthorized": "permanent",
    "model_not_found": "permanent",
    "slow": "transient",
    "truncated_tool_call": "malformed",
}
TOOL_FAULTS = ("invalid_tool_arguments", "unknown_tool", "parallel_storm")
# Runs the worker service (``async with workers() as service``): the ``workers`` fixture.
Workers = Callable[[], contextlib.AbstractAsyncContextManager[Any]]


def test_every_fault_is_classified_or_a_tool_fault() -> None:
    assert set(FAULTS) == set(CLASSES) | set(TOOL_FAULTS)


def test_random_faults_are_seeded_and_leave_the_script_for_the_next_call() -> None:
    runs = []
    for _ in range(2):
        with FakeOpenAIServer() as server:
            server.inject_faults(0.5, seed=7, kinds=["server_error", "empty_choices"])
            server.respond_with(lambda request: "fine")
            client = server.openai_client()
            for _ in range(20):
                with contextlib.suppress(openai.OpenAIError, AttributeError):
                    client.chat.completions.create(
                        model=FAKE_MODEL, messages=[{"role": "user", "content": "hi"}]
                    )
            runs.append(server.faults_injected)
    assert runs[0] == runs[1]
    assert 3 < len(runs[0]) < 17
    assert set(runs[0]) == {"server_error", "empty_choices"}


async def _outcomes(pool: asyncpg.Pool) -> list[str]:
    rows = await pool.fetch("SELECT outcome FROM llm_calls ORDER BY created_at, id")
    return [row["outcome"] for row in rows]


def _times(kind: str) -> int:
    """How many answers the fault takes to exhaust the boundary's tries."""
    return FAST["attempts"] if CLASSES.get(kind) == "transient" else 1  # type: ignore[return-value]


async def _completed(pool: asyncpg.Pool, ticket_id: str) -> None:
    await assert_eventually(
        lambda: state_is(pool, ticket_id, "completed"), timeout=30, message="the ticket completed"
    )


# -- the module, against the fake over HTTP ------------------------------------------------


@pytest.mark.parametrize("kind", sorted(CLASSES))
async def test_each_fault_is_classified_and_recorded(
    kind: str, pool: asyncpg.Pool, fake_llm: FakeOpenAIServer
) -> None:
    from controlplane.llm import Accounting, LlmClient, LlmError

    fake_llm.script(*[fault(kind)] * _times(kind))
    client = LlmClient(pool, fake_llm.async_openai_client(), LlmSettings(**FAST))
    with pytest.raises(LlmError) as raised:
        await client.complete(
            model=FAKE_MODEL,
            messages=[{"role": "user", "content": "hello"}],
            accounting=Accounting(None),
        )
    assert raised.value.outcome == CLASSES[kind]
    assert await _outcomes(pool) == [CLASSES[kind]] * _times(kind)
    assert raised.value.llm_call_id is not None


async def test_a_transient_failure_is_retried_after_retry_after(
    pool: asyncpg.Pool, fake_llm: FakeOpenAIServer
) -> None:
    from controlplane.llm import Accounting, LlmClient

    fake_llm.script(fault("rate_limited"), "fine now")
    client = LlmClient(pool, fake_llm.async_openai_client(), LlmSettings(**FAST))
    started = time.monotonic()
    answer = await client.complete(
        model=FAKE_MODEL, messages=[{"role": "user", "content": "hi"}], accounting=Accounting(None)
    )
    assert answer.content == "fine now"
    assert time.monotonic() - started >= 0.9  # Retry-After: 1, over the 10 ms backoff
    assert await _outcomes(pool) == ["transient", "ok"]


@pytest.mark.parametrize(
    ("status", "text", "outcome"),
    [
        (
            400,
            "This model's maximum context length is 16384 tokens. However, you requested "
            "122946 tokens (112946 in the messages, 10000 in the completion).",
            "context",
        ),  # vLLM
        (
            400,
            "The prompt (total length 25938) is too long to fit into the model (context "
            "length 4096).",
            "context",
        ),  # vLLM, later versions
        (500, "input length exceeds the context length", "context"),  # Ollama
        (400, "prompt is too long: 210000 tokens > 200000 maximum", "context"),  # gateways
        (400, "context_length_exceeded: too long", "context"),  # OpenAI's code
        (429, "You exceeded your current quota: insufficient_quota", "permanent"),
        (403, "forbidden", "permanent"),
        (408, "request timeout", "transient"),
    ],
)
def test_provider_wordings_are_classified(status: int, text: str, outcome: str) -> None:
    from controlplane.llm.client import classify_status

    assert classify_status(status, text, {}).outcome == outcome


def test_an_error_a_gateway_wraps_in_a_200_is_classified() -> None:
    from controlplane.llm import ContextExceeded, Transient
    from controlplane.llm.client import parse

    with pytest.raises(ContextExceeded):
        parse("llm_1", b'{"error": {"message": "This model\'s maximum context length is 8192"}}')
    with pytest.raises(Transient):
        parse("llm_1", b'{"error": "upstream connect error"}')
    with pytest.raises(Transient):
        parse("llm_1", b"[1, 2]")


def test_invalid_arguments_are_described_against_the_schema_the_model_saw() -> None:
    from controlplane.tools.registry import Refusal
    from controlplane.workers.tools.toolbox import TOOLS

    def arguments_problem(name: str, arguments: str) -> str | None:
        bound = TOOLS.bind(name, arguments)
        return bound.error if isinstance(bound, Refusal) else None

    assert arguments_problem("shell", '{"command": "ls"}') is None
    assert "must be string" in (arguments_problem("shell", '{"command": 5}') or "")
    assert "not valid JSON" in (arguments_problem("shell", '{"command": ') or "")
    assert "no tool" in (arguments_problem("rm_rf", "{}") or "")
    assert "required" in (arguments_problem("shell", "{}") or "")


# -- the router ------------------------------------------------------------------------------


def _router(pool: asyncpg.Pool, fake_llm: FakeOpenAIServer, intake: Intake) -> Router:
    router = Router(
        pool, fake_llm.async_openai_client(timeout=1.0), FAKE_MODEL, policy=intake.policy
    )
    llm = getattr(router, "llm", None)
    if llm is not None:
        llm.settings = LlmSettings(**FAST)
    return router


def _decide(request: ChatRequest) -> Reply:
    """The model when it is back: a ticket for each trigger, then done (this turn's tool
    results are after its batch, the last user message)."""
    last_user = max(
        (i for i, m in enumerate(request.messages) if m.get("role") == "user"), default=0
    )
    this_turn = [m for m in request.messages[last_user + 1 :] if m.get("role") == "tool"]
    if any('"ticket"' in str(m.get("content")) for m in this_turn):
        return Reply(content="Done.")
    return tickets_for_batch(request)


@pytest.mark.parametrize("kind", sorted(FAULTS))
async def test_the_router_survives_each_fault_and_decides_the_batch_later(
    kind: str,
    pool: asyncpg.Pool,
    db: async_sessionmaker[AsyncSession],
    fake_llm: FakeOpenAIServer,
    database_url: str,
) -> None:
    await save_policy(db, Admission(default=SourceAdmission(users=[ALICE.id])))
    intake = Intake(pool)
    router = _router(pool, fake_llm, intake)
    fake_llm.script(*[fault(kind)] * _times(kind))
    fake_llm.respond_with(_decide)
    async with router_running(router, pool, asyncpg_dsn(database_url)) as service:
        asked = await ask(intake, 1)

        async def decided() -> bool:
            return bool(
                await pool.fetchval(
                    "SELECT count(*) FROM mandates m JOIN triggers g ON g.id = m.trigger_id "
                    "WHERE g.id = $1 AND g.routed_at IS NOT NULL",
                    asked.trigger_id,
                )
            )

        await assert_eventually(decided, timeout=20, message="the batch decided")
        assert not service.task.done(), "the router loop ended"
        assert await pool.fetchval("SELECT count(*) FROM triggers WHERE routed_at IS NULL") == 0
        assert await pool.fetchval("SELECT count(*) FROM tickets") == 1
    outcomes = await _outcomes(pool)
    if kind in CLASSES:
        assert outcomes[: _times(kind)] == [CLASSES[kind]] * _times(kind)
    assert outcomes[-1] == "ok"


# -- the workers -----------------------------------------------------------------------------


@pytest.fixture(name="ticket_id")
async def ticket_id_fixture(pool: asyncpg.Pool, device: LocalDevice, tmp_path: Path) -> str:
    """A ticket for the device, to work in the test's temporary directory."""
    ticket_id, _ = await ticket(pool, device, workdir=str(tmp_path))
    return ticket_id


@pytest.fixture(name="workers")
def workers_fixture(
    pool: asyncpg.Pool, queue: CommandQueue, fake_llm: FakeOpenAIServer, dsn: str
) -> Workers:
    """The worker service, to run (``async with workers() as service``) with quick retries."""
    return lambda: workers_running(pool, queue, fake_llm, dsn, boundary=LlmSettings(**FAST))


@pytest.mark.parametrize("kind", sorted(FAULTS))
async def test_a_worker_round_given_each_fault_ends_without_the_service(
    kind: str,
    pool: asyncpg.Pool,
    fake_llm: FakeOpenAIServer,
    ticket_id: str,
    workers: Workers,
) -> None:
    fake_llm.script(*[fault(kind)] * _times(kind))
    fake_llm.respond_with(lambda request: report_reply("ready", "all done"))
    expected = CLASSES.get(kind)
    async with workers() as service:
        if expected == "context":
            # Compacting cannot shrink a first call: the round ends blocked, the class named.
            async def blocked() -> bool:
                return bool(
                    await pool.fetchval(
                        "SELECT count(*) FROM reports WHERE ticket_id = $1 AND status = 'blocked' "
                        "AND summary LIKE $2",
                        ticket_id,
                        f"%({expected})%",
                    )
                )

            await assert_eventually(blocked, timeout=20, message="a blocked report")
        else:
            # Transient, malformed or permanent: the round fails and the next one, after a
            # backoff, reports; a tool fault goes back to the model, which then reports.
            await _completed(pool, ticket_id)
        assert not service.task.done(), "the worker service ended"
    outcomes = await _outcomes(pool)
    if expected is not None:
        assert outcomes[: _times(kind)] == [expected] * _times(kind)
    else:
        assert set(outcomes) == {"ok"}
        # Every call of the faulty answer got its tool's error back, each exactly once.
        second = fake_llm.chat_requests[1]
        errors = tool_results(second)
        assert errors
        assert all("error" in e for e in errors)
        if kind == "parallel_storm":
            assert len(errors) == 300
            assert sum("same call" in e["error"] for e in errors) == 299


async def test_wrong_argument_types_go_back_to_the_model_and_the_corrected_call_runs(
    pool: asyncpg.Pool,
    device: LocalDevice,
    fake_llm: FakeOpenAIServer,
    ticket_id: str,
    workers: Workers,
) -> None:
    fake_llm.script(
        Reply(tool_calls=[ToolCall("shell", {"command": ["echo", "corrected"]})]),
        Reply(tool_calls=[ToolCall("shell", {"command": "echo corrected"})]),
        report_reply("ready", "ok"),
    )
    async with workers():
        await _completed(pool, ticket_id)
    _first, second, _ = fake_llm.chat_requests
    (refused,) = tool_results(second)
    assert refused == {"error": "arguments.command must be string, not array"}
    (ran,) = tool_results(fake_llm.chat_requests[2])[-1:]
    assert ran["exit_code"] == 0
    assert ran["output"] == "corrected\n"
    assert len(device.ran) == 1  # the wrong call never reached the device


async def test_a_2mb_text_answer_is_cut_and_spilled_before_people_see_it(
    pool: asyncpg.Pool,
    fake_llm: FakeOpenAIServer,
    ticket_id: str,
    workers: Workers,
) -> None:
    huge = "What now? " + "x" * (2 * 1024 * 1024)
    # A provider that ignores the output cap; streamed in 64 KiB pieces (token-sized pieces
    # would make the fake itself take minutes, as a real server would to write 2 MB).
    fake_llm.stream_chunk_chars = 64 * 1024
    fake_llm.honour_output_cap = False
    fake_llm.script(Reply(content=huge))
    async with workers():

        async def asked() -> list[str]:
            # The worker's report, as the router gets it to tell the thread.
            rows = await pool.fetch(
                "SELECT text FROM triggers WHERE source = 'agent' AND actor_id = $1 "
                "AND kind = 'report.question'",
                ticket_id,
            )
            return [row["text"] for row in rows]

        await assert_eventually(asked, timeout=30, message="the worker's question")
        (question,) = await asked()
    assert len(question.encode()) < 24 * 1024
    (blob_id,) = re.findall(r"blob (blb_\w+)", question)
    data = await pool.fetchval("SELECT data FROM blobs WHERE id = $1", blob_id)
    assert data == huge.encode()
    # The session holds the cut text too: the next call does not resend 2 MB.
    stored = await pool.fetchval(
        "SELECT max(length(content::text)) FROM session_messages s JOIN sessions x "
        "ON x.id = s.session_id WHERE x.ticket_id = $1",
        ticket_id,
    )
    assert stored < 24 * 1024


# -- a real `superagent serve` ---------------------------------------------------------------


def _model_of_serve(request: ChatRequest) -> Reply:
    """The router decides (a ticket per trigger); a worker reports at once."""
    if "report" in request.tool_names():
        return report_reply("question", "?")
    return _decide(request)


async def test_serve_stays_up_and_routes_everything_through_random_faults(
    empty_database: str, fake_llm: FakeOpenAIServer, tmp_path: Path
) -> None:
    await prepare_database(empty_database, [ALICE.id])
    # Scripted faults first (the first batch meets them for sure), then random ones.
    fake_llm.script(fault("empty_choices"), fault("html_200"), fault("html_200"))
    fake_llm.inject_faults(0.3, seed=11, kinds=[k for k in FAULTS if k != "slow"])
    fake_llm.respond_with(_model_of_serve)
    port = free_port()
    env = serve_env(empty_database, fake_llm.url, tmp_path / "state", port)
    replica = ReplicaProcess(env, tmp_path / "serve.log", port)
    replica.start()
    pool = await asyncpg.create_pool(asyncpg_dsn(empty_database), min_size=1, max_size=2)
    assert pool is not None
    try:
        await assert_eventually(replica.up, timeout=60, message=f"serve is up ({replica.log})")
        intake = Intake(pool)
        asked = [await ask(intake, n) for n in range(1, 6)]

        async def all_routed() -> bool:
            assert replica.alive(), f"serve exited (see {replica.log})"
            assert await replica.up(), "serve stopped answering"
            routed = await pool.fetchval(
                "SELECT count(*) FROM triggers g JOIN mandates m ON m.trigger_id = g.id "
                "WHERE g.id = ANY($1::text[]) AND g.routed_at IS NOT NULL",
                [a.trigger_id for a in asked],
            )
            return bool(routed == len(asked))

        await assert_eventually(all_routed, timeout=120, message="every trigger routed")
        outcomes = {row["outcome"] for row in await pool.fetch("SELECT outcome FROM llm_calls")}
        assert {"ok", "malformed", "transient"} <= outcomes
    finally:
        await pool.close()
        replica.stop()
    assert replica.kills == 0


async def test_the_router_and_a_worker_each_ask_for_their_own_output_cap(
    pool: asyncpg.Pool,
    db: async_sessionmaker[AsyncSession],
    fake_llm: FakeOpenAIServer,
    database_url: str,
    ticket_id: str,
    queue: CommandQueue,
    dsn: str,
) -> None:
    """One generation of a small local model ran to 1,831 tokens (eight minutes) for a
    step that needed a few dozen: each role sends its own output cap."""
    capped = LlmSettings(**FAST, router_max_tokens=300, worker_max_tokens=700)
    await save_policy(db, Admission(default=SourceAdmission(users=[ALICE.id])))
    intake = Intake(pool)
    router = _router(pool, fake_llm, intake)
    router.llm.settings = capped
    fake_llm.respond_with(_decide)
    async with router_running(router, pool, asyncpg_dsn(database_url)):
        await ask(intake, 1)
        await assert_eventually(lambda: fake_llm.chat_requests, timeout=20)
    routed = [r.body.get("max_tokens") for r in fake_llm.chat_requests]
    fake_llm.respond_with(lambda request: report_reply("ready", "all done"))
    async with workers_running(pool, queue, fake_llm, dsn, boundary=capped):
        await assert_eventually(
            lambda: len(fake_llm.chat_requests) > len(routed), timeout=20, message="a worker call"
        )
    worked = [r.body.get("max_tokens") for r in fake_llm.chat_requests[len(routed) :]]
    assert routed, "no router call"
    assert set(routed) == {300}, routed
    assert worked, "no worker call"
    assert set(worked) == {700}, worked
