"""The router given tool calls written in the message text, as small local models write them
(llama.cpp's llama-server returns them as plain ``content``, no ``tool_calls``).

Real parts: the scripted fake OpenAI server over HTTP, the official client, a real
Postgres, real router turns. A call written in the text in each form is run through the
same tools as a native one; a name that is no tool is refused to the model; a call that
cannot be read with confidence is answered as an error and nothing runs; prose that only
mentions a tool is a text answer.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.ingest.admission import Admission, SourceAdmission
from controlplane.ingest.intake import Intake
from controlplane.router.containment import Undecided
from controlplane.router.router import Router, TurnFailed
from tests.fakes.openai_server import FAKE_MODEL, ChatRequest, FakeOpenAIServer, Reply, ToolCall
from tests.support.helpers import save_policy
from tests.support.router_harness import ALICE, ask, batch_of

POLICY = Admission(default=SourceAdmission(users=[ALICE.id]))


@pytest.fixture
async def pool(pool: asyncpg.Pool, db: async_sessionmaker[AsyncSession]) -> asyncpg.Pool:
    await save_policy(db, POLICY)
    return pool


@pytest.fixture
def intake(pool: asyncpg.Pool) -> Intake:
    return Intake(pool)


@pytest.fixture
def router(pool: asyncpg.Pool, fake_llm: FakeOpenAIServer, intake: Intake) -> Router:
    return Router(pool, fake_llm.async_openai_client(), FAKE_MODEL, policy=intake.policy)


def ticket_arguments(trigger: str) -> dict[str, Any]:
    return {
        "title": "fix the flaky test",
        "scope": "as asked",
        "threads": [],
        "device": None,
        "mandate_from": trigger,
    }


def _js(value: Any) -> str:
    return json.dumps(value)


# Each form a model writes a create_ticket call in, and the form the transcript records.
FORMS: dict[str, tuple[Callable[[str], str], str]] = {
    "fenced json (Qwen through llama-server)": (
        lambda t: (
            "I'll file a ticket for this.\n```json\n"
            + _js({"name": "create_ticket", "arguments": ticket_arguments(t)})
            + "\n```"
        ),
        "fenced",
    ),
    "fenced without a language": (
        lambda t: (
            "```\n" + _js({"name": "create_ticket", "arguments": ticket_arguments(t)}) + "\n```"
        ),
        "fenced",
    ),
    "fenced tool_call": (
        lambda t: (
            "```tool_call\n"
            + _js({"name": "create_ticket", "arguments": ticket_arguments(t)})
            + "\n```"
        ),
        "fenced",
    ),
    "hermes tags": (
        lambda t: (
            "<tool_call>\n"
            + _js({"name": "create_ticket", "arguments": ticket_arguments(t)})
            + "\n</tool_call>"
        ),
        "tagged",
    ),
    "bare llama-style parameters": (
        lambda t: _js({"name": "create_ticket", "parameters": ticket_arguments(t)}),
        "bare",
    ),
    "bare inside prose": (
        lambda t: (
            "Filing it now: "
            + _js({"name": "create_ticket", "arguments": ticket_arguments(t)})
            + " and that is all."
        ),
        "bare",
    ),
    "a list of calls": (
        lambda t: _js([{"name": "create_ticket", "arguments": ticket_arguments(t)}]),
        "list",
    ),
    "openai-shaped, arguments as a JSON string": (
        lambda t: (
            "```json\n"
            + _js(
                {
                    "type": "function",
                    "function": {"name": "create_ticket", "arguments": _js(ticket_arguments(t))},
                }
            )
            + "\n```"
        ),
        "fenced",
    ),
}


def _written(write: Callable[[str], str]) -> Callable[[ChatRequest], Reply]:
    def answer(request: ChatRequest) -> Reply:
        if request.tool_results():
            return Reply(content="Done.")
        (trigger,) = batch_of(request)
        return Reply(content=write(trigger))

    return answer


async def _stored_calls(pool: asyncpg.Pool) -> list[dict[str, Any]]:
    """Every tool call the router's session stored, in order."""
    rows = await pool.fetch(
        "SELECT content FROM session_messages WHERE role = 'assistant' ORDER BY seq"
    )
    calls: list[dict[str, Any]] = []
    for row in rows:
        content = row["content"]
        content = json.loads(content) if isinstance(content, str) else content
        calls.extend(content["message"].get("tool_calls") or [])
    return calls


async def _replies(pool: asyncpg.Pool, text: str) -> int:
    """How many replies starting with ``text`` were queued."""
    return int(
        await pool.fetchval(
            "SELECT count(*) FROM effects WHERE kind = 'reply' AND payload->>'text' LIKE $1",
            text + "%",
        )
    )


async def _undecided(router: Router) -> TurnFailed:
    """The turn decided nothing about its request: it fails, for containment to count
    (not marked routed in silence)."""
    with pytest.raises(TurnFailed) as failed:
        await router.turn()
    assert isinstance(failed.value.cause, Undecided)
    return failed.value


def _errors(request: ChatRequest) -> list[str]:
    return [
        json.loads(m["content"]).get("error", "")
        for m in request.tool_results()
        if "error" in json.loads(m["content"])
    ]


@pytest.mark.parametrize("form", sorted(FORMS))
async def test_a_create_ticket_call_written_in_the_text_makes_the_ticket(
    form: str, router: Router, intake: Intake, pool: asyncpg.Pool, fake_llm: FakeOpenAIServer
) -> None:
    write, recorded = FORMS[form]
    asked = await ask(intake, 1)
    fake_llm.respond_with(_written(write))
    assert await router.turn() == 1
    mandate = await pool.fetchrow("SELECT ticket_id, trigger_id FROM mandates")
    assert mandate is not None, "the call written in the text did not make the ticket"
    assert mandate["trigger_id"] == asked.trigger_id
    assert await pool.fetchval("SELECT count(*) FROM tickets") == 1
    decision = await pool.fetchrow("SELECT tool, ok FROM router_decisions")
    assert decision is not None
    assert (decision["tool"], decision["ok"]) == ("create_ticket", True)
    (call,) = await _stored_calls(pool)
    assert call["function"]["name"] == "create_ticket"
    assert call["form"] == recorded


async def test_a_reply_written_in_tags_is_sent(
    router: Router, intake: Intake, pool: asyncpg.Pool, fake_llm: FakeOpenAIServer
) -> None:
    asked = await ask(intake, 1, "@superagent what is the status of the build?")

    def answer(request: ChatRequest) -> Reply:
        if request.tool_results():
            return Reply(content="Done.")
        call = {"name": "reply", "arguments": {"thread": asked.thread_id, "text": "It is green."}}
        return Reply(content=f"<tool_call>\n{_js(call)}\n</tool_call>")

    fake_llm.respond_with(answer)
    assert await router.turn() == 1
    texts = await pool.fetch(
        "SELECT payload->>'text' AS text FROM effects WHERE kind = 'reply' "
        "AND payload->>'thread_id' = $1",
        asked.thread_id,
    )
    assert [row["text"].startswith("It is green.") for row in texts] == [True]


async def test_a_tool_that_does_not_exist_is_not_run_and_the_model_is_told(
    router: Router, intake: Intake, pool: asyncpg.Pool, fake_llm: FakeOpenAIServer
) -> None:
    await ask(intake, 1)
    fake_llm.script(
        Reply(content='```json\n{"name": "delete_everything", "arguments": {"all": true}}\n```'),
        Reply(content="Nothing to do then."),
        Reply(content="Still nothing."),  # after the reminder of what is undecided
    )
    await _undecided(router)  # the request is not routed in silence
    second = fake_llm.chat_requests[1]  # the model was asked again, and told why
    (error,) = _errors(second)
    assert "delete_everything" in error
    assert "create_ticket" in error
    assert "reply" in error
    assert await pool.fetchval("SELECT count(*) FROM tickets") == 0
    refused = await pool.fetchrow("SELECT tool, ok FROM router_decisions")
    assert refused is not None
    assert (refused["tool"], refused["ok"]) == ("delete_everything", False)


async def test_a_call_that_cannot_be_read_is_answered_as_an_error_and_the_fix_runs(
    router: Router, intake: Intake, pool: asyncpg.Pool, fake_llm: FakeOpenAIServer
) -> None:
    asked = await ask(intake, 1)
    # Cut off in the middle (a missing brace and quote): it names create_ticket, but what
    # it would create cannot be read.
    broken = (
        '```json\n{"name": "create_ticket", "arguments": {"title": "fix the flaky test", '
        '"scope": "as asked\n```'
    )
    fake_llm.script(
        Reply(content=broken),
        lambda request: Reply(
            tool_calls=[ToolCall("create_ticket", ticket_arguments(batch_of(request)[0]))]
        ),
    )
    fake_llm.respond_with(lambda request: Reply(content="Done."))
    assert await router.turn() == 1
    second = fake_llm.chat_requests[1]
    (error,) = _errors(second)
    assert "create_ticket" in error
    assert "could not be read" in error
    # Nothing ran on the unreadable call; the corrected native one made the ticket.
    decisions = await pool.fetch("SELECT tool, ok FROM router_decisions")
    assert [(d["tool"], d["ok"]) for d in decisions] == [("create_ticket", True)]
    mandate = await pool.fetchrow("SELECT trigger_id FROM mandates")
    assert mandate is not None
    assert mandate["trigger_id"] == asked.trigger_id


async def test_calls_in_two_forms_are_ambiguous_and_none_runs(
    router: Router, intake: Intake, pool: asyncpg.Pool, fake_llm: FakeOpenAIServer
) -> None:
    asked = await ask(intake, 1)
    reply = {"name": "reply", "arguments": {"thread": asked.thread_id, "text": "On it."}}
    ticket = {"name": "create_ticket", "arguments": ticket_arguments(asked.trigger_id)}
    fake_llm.script(
        Reply(content=f"<tool_call>{_js(reply)}</tool_call>\nThen:\n```json\n{_js(ticket)}\n```"),
        Reply(content="I will wait."),
        Reply(content="Still waiting."),  # after the reminder of what is undecided
    )
    await _undecided(router)  # the request is not routed in silence
    (error,) = _errors(fake_llm.chat_requests[1])
    assert "two forms" in error
    assert await pool.fetchval("SELECT count(*) FROM tickets") == 0
    assert await _replies(pool, "On it.") == 0
    assert await pool.fetchval("SELECT count(*) FROM router_decisions") == 0


async def test_a_tool_name_in_a_code_block_that_is_not_a_call_is_not_run(
    router: Router, intake: Intake, pool: asyncpg.Pool, fake_llm: FakeOpenAIServer
) -> None:
    """JSON that names a tool the wrong way (not name + arguments) is not guessed at."""
    asked = await ask(intake, 1)
    wrong = {"tool": "create_ticket", "title": "fix", "mandate_from": asked.trigger_id}
    fake_llm.script(
        Reply(content=f"```json\n{_js(wrong)}\n```"),
        Reply(content="Later."),
        Reply(content="Still later."),  # after the reminder of what is undecided
    )
    await _undecided(router)  # the request is not routed in silence
    (error,) = _errors(fake_llm.chat_requests[1])
    assert "create_ticket" in error
    assert "could not be read" in error
    assert await pool.fetchval("SELECT count(*) FROM tickets") == 0


async def test_prose_that_mentions_a_tool_is_a_text_answer(
    router: Router, intake: Intake, pool: asyncpg.Pool, fake_llm: FakeOpenAIServer
) -> None:
    await ask(intake, 1)
    fake_llm.script(
        Reply(
            content="No create_ticket or reply is needed: alice only said thanks. "
            'For the record, the settings were {"retries": 3}.'
        ),
        Reply(content="Nothing."),
    )
    await _undecided(router)  # the request is not routed in silence
    # A text answer ends the turn, after the one reminder of what it left undecided.
    assert len(fake_llm.chat_requests) == 2
    assert await pool.fetchval("SELECT count(*) FROM tickets") == 0
    assert await pool.fetchval("SELECT count(*) FROM router_decisions") == 0
    assert await _stored_calls(pool) == []


async def test_native_calls_are_run_as_before_and_text_beside_them_is_not_read(
    router: Router, intake: Intake, pool: asyncpg.Pool, fake_llm: FakeOpenAIServer
) -> None:
    asked = await ask(intake, 1)
    also = {"name": "reply", "arguments": {"thread": asked.thread_id, "text": "twice?"}}
    fake_llm.script(
        Reply(
            content=f"<tool_call>{_js(also)}</tool_call>",
            tool_calls=[ToolCall("create_ticket", ticket_arguments(asked.trigger_id), id="c-1")],
        )
    )
    assert await router.turn() == 1
    (call,) = await _stored_calls(pool)
    assert call["id"] == "c-1"
    assert "form" not in call  # the record of a native call is as it always was
    assert await _replies(pool, "twice?") == 0
    assert await pool.fetchval("SELECT count(*) FROM tickets") == 1
