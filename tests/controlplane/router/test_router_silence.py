"""No request ends in silence: a router turn that decides nothing about a trigger fails it
through the router's containment (counted, tried alone, set aside with its reason), a
model repeating a refused call is stopped at the second repeat, and an explicit request
given up on is answered in one line while the admin is alerted.

Found with real small models (issue 32): the same refused call eight times, then the turn
ended and the request was marked routed, with no reply, no ticket and no alert.

Real parts throughout: Postgres, the fake OpenAI server over HTTP, the official client, a
real RouterService under its own leadership, the CLI as a user runs it.
"""

from __future__ import annotations

import json

import asyncpg
import pytest

from controlplane.ingest.intake import Intake
from controlplane.router.router import Router, TurnFailed
from controlplane.settings import LlmSettings, RouterSettings, Settings, WatchdogSettings
from controlplane.tickets import reports
from superagent_shared.ids import new_id
from tests.fakes.openai_server import ChatRequest, FakeOpenAIServer, Reply, ToolCall
from tests.support.helpers import assert_eventually, run_cli
from tests.support.router_harness import (  # noqa: F401 - fixtures
    ALICE,
    QUICK_LLM,
    admin_alerts,
    admitted_pool_fixture,
    ask,
    batch_of,
    dsn_fixture,
    fresh,
    intake_fixture,
    replies_to,
    router_fixture,
    router_running,
)

FAST = QUICK_LLM
ADMIN = "web:admin"
CHITCHAT = "thanks, that was lovely"


def _settings(quarantine_after: int = 2) -> Settings:
    return Settings(
        llm=LlmSettings(**FAST),
        router=RouterSettings(quarantine_after=quarantine_after),
        watchdog=WatchdogSettings(admin_thread=ADMIN),
    )


async def _trigger(pool: asyncpg.Pool, trigger_id: str) -> asyncpg.Record:
    row = await pool.fetchrow(
        "SELECT id, thread_id, routed_at, undecidable_at, route_attempts, route_error "
        "FROM triggers WHERE id = $1",
        trigger_id,
    )
    assert row is not None
    return row


async def _undecidable(pool: asyncpg.Pool, trigger_id: str) -> bool:
    return bool(
        await pool.fetchval(
            "SELECT undecidable_at IS NOT NULL AND routed_at IS NOT NULL FROM triggers "
            "WHERE id = $1",
            trigger_id,
        )
    )


def _ignore_the_thread(request: ChatRequest) -> Reply:
    """The 1.5B model's loop: ``ignore`` with the thread's id where the trigger's belongs,
    whatever the refusal says."""
    text = request.last_user_message() or ""
    thread = text.split("thread ", 1)[1].split(" ", 1)[0] if "thread " in text else "x"
    return Reply(tool_calls=[ToolCall("ignore", {"trigger": thread, "reason": "noise"})])


async def test_a_router_repeating_a_refused_call_answers_the_request_and_sets_it_aside(
    router: Router,
    intake: Intake,
    pool: asyncpg.Pool,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    database_url: str,
) -> None:
    fake_llm.respond_with(_ignore_the_thread)
    async with router_running(
        router, pool, dsn, settings=_settings(quarantine_after=2), retry_base=0.02
    ) as service:
        asked = await ask(intake, 1)
        await assert_eventually(
            lambda: _undecidable(pool, asked.trigger_id), timeout=30, message="set aside"
        )
        assert not service.task.done()
    row = await _trigger(pool, asked.trigger_id)
    assert row["route_attempts"] == 2
    assert "ignore" in row["route_error"]
    assert "must be a trg_ id" in row["route_error"]  # the refusal the model kept getting
    # Each attempt stopped at the second repeat: three identical calls, not eight.
    attempts = [r for r in fake_llm.chat_requests if fresh(r)]
    assert len(attempts) == 2
    assert len(fake_llm.chat_requests) == 6
    # The person is told, once, in one line; the admin is alerted.
    (told,) = await replies_to(pool, row["thread_id"])
    assert "could not act" in told
    assert "admin" in told
    assert "\n" not in told.strip()
    (alert,) = await admin_alerts(pool)
    assert asked.trigger_id in alert
    assert "ignore" in alert
    assert f"superagent triggers retry {asked.trigger_id}" in alert
    # `triggers show` names the refused calls.
    shown = run_cli(database_url, "triggers", "show", asked.trigger_id)
    assert shown.returncode == 0, shown.stderr
    assert "refused" in shown.stdout
    assert "ignore" in shown.stdout
    assert "must be a trg_ id" in shown.stdout


async def test_a_turn_that_leaves_a_trigger_undecided_fails_it_alone_and_sets_it_aside(
    router: Router, intake: Intake, pool: asyncpg.Pool, fake_llm: FakeOpenAIServer, dsn: str
) -> None:
    """The model files a ticket for one request and says nothing at all about the other."""

    def respond(request: ChatRequest) -> Reply:
        if not fresh(request):
            return Reply(content="Done.")
        text = request.last_user_message() or ""
        wanted = [t for t in batch_of(request) if CHITCHAT not in text.split(t, 1)[1][:200]]
        if not wanted:
            return Reply(content="Nothing to do here.")
        return Reply(
            tool_calls=[
                ToolCall(
                    "create_ticket",
                    {
                        "title": "fix it",
                        "scope": "as asked",
                        "threads": [],
                        "device": None,
                        "mandate_from": trigger,
                    },
                )
                for trigger in wanted
            ]
        )

    work = await ask(intake, 1)
    chat = await ask(intake, 2, f"@superagent {CHITCHAT}")
    fake_llm.respond_with(respond)
    async with router_running(
        router, pool, dsn, settings=_settings(quarantine_after=2), retry_base=0.02
    ) as service:
        await assert_eventually(
            lambda: _undecidable(pool, chat.trigger_id), timeout=30, message="set aside"
        )
        assert not service.task.done()
    assert batch_of(fake_llm.chat_requests[0]) == [work.trigger_id, chat.trigger_id]
    decided = await _trigger(pool, work.trigger_id)
    assert decided["routed_at"] is not None
    assert decided["undecidable_at"] is None
    assert decided["route_attempts"] == 0
    assert await pool.fetchval(
        "SELECT count(*) FROM mandates WHERE trigger_id = $1", work.trigger_id
    )
    row = await _trigger(pool, chat.trigger_id)
    assert row["route_attempts"] == 2  # the batch's turn, then its own
    assert "without deciding" in row["route_error"]
    later = [batch_of(r) for r in fake_llm.chat_requests[1:] if fresh(r)]
    assert later == [[chat.trigger_id]]  # tried alone, then set aside
    (told,) = await replies_to(pool, row["thread_id"])
    assert "could not act" in told
    assert await replies_to(pool, decided["thread_id"]) == []


async def test_triggers_show_names_the_decision_and_each_refused_call(
    router: Router,
    intake: Intake,
    pool: asyncpg.Pool,
    fake_llm: FakeOpenAIServer,
    database_url: str,
) -> None:
    asked = await ask(intake, 1)
    fake_llm.script(
        Reply(tool_calls=[ToolCall("ignore", {"trigger": asked.thread_id, "reason": "noise"})]),
        Reply(
            tool_calls=[
                ToolCall("create_ticket", {"title": "fix it", "mandate_from": "admin"}),
            ]
        ),
        Reply(tool_calls=[ToolCall("ignore", {"trigger": asked.trigger_id, "reason": "thanks"})]),
        Reply(tool_calls=[ToolCall("reply", {"thread": asked.thread_id, "text": "Thanks!"})]),
    )
    assert await router.turn() == 1
    shown = run_cli(database_url, "triggers", "show", asked.trigger_id)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    refused = [line for line in lines if "refused" in line and " call " in line]
    assert len(refused) == 3, shown.stdout
    assert "ignore" in refused[0]
    assert asked.thread_id in refused[0]  # the arguments as the model sent them
    assert "create_ticket" in refused[1]
    assert "admin" in refused[1]
    assert "must hear back" in refused[2]  # an explicit request is answered, not ignored
    (decision,) = [line for line in lines if "decision:" in line]
    assert "reply" in decision
    as_json = run_cli(database_url, "triggers", "show", asked.trigger_id, "--json")
    assert as_json.returncode == 0, as_json.stderr
    shown_json = json.loads(as_json.stdout)
    assert [(c["tool"], c["ok"]) for c in shown_json["calls"]] == [
        ("ignore", False),
        ("create_ticket", False),
        ("ignore", False),
        ("reply", True),
    ]
    assert shown_json["calls"][1]["arguments"]["mandate_from"] == "admin"
    assert "reply" in shown_json["decision"]


async def test_a_stop_or_a_subscribe_decides_the_request_it_answers(
    router: Router, intake: Intake, pool: asyncpg.Pool, fake_llm: FakeOpenAIServer
) -> None:
    """Calls that name no trigger still decide the requests they act on: a stop asked for
    by naming the ticket, a thread given to a ticket. Neither is failed as undecided."""
    ticket, other = new_id("tkt"), new_id("tkt")
    for live in (ticket, other):
        await pool.execute(
            "INSERT INTO tickets (id, title, state) VALUES ($1, 'x', 'running')", live
        )
    stop = await ask(intake, 1, f"@superagent please cancel {ticket}")
    join = await ask(intake, 2, "@superagent this belongs with the other one")
    fake_llm.script(
        Reply(
            tool_calls=[
                ToolCall("stop_ticket", {"ticket": ticket, "reason": "asked"}),
                ToolCall("subscribe", {"thread": join.thread_id, "ticket": other}),
            ]
        )
    )
    assert await router.turn() == 2
    for asked in (stop, join):
        row = await _trigger(pool, asked.trigger_id)
        assert row["routed_at"] is not None
        assert row["route_attempts"] == 0


async def _decisions(pool: asyncpg.Pool) -> list[tuple[str, bool, str]]:
    rows = await pool.fetch(
        "SELECT tool, ok, outcome FROM router_decisions ORDER BY created_at, id"
    )
    return [(row["tool"], row["ok"], row["outcome"]) for row in rows]


async def test_an_explicit_request_is_not_ignored_until_its_thread_is_answered(
    router: Router, intake: Intake, pool: asyncpg.Pool, fake_llm: FakeOpenAIServer
) -> None:
    """The 1.5B model's other way to silence: ``ignore`` accepted on "add a CONTRIBUTORS
    file", and nobody answered. An explicit request is answered (a ticket or a reply);
    ``ignore`` is refused, saying so, until the turn has replied on its thread."""
    asked = await ask(intake, 1, "@superagent add a CONTRIBUTORS file")
    fake_llm.script(
        Reply(tool_calls=[ToolCall("ignore", {"trigger": asked.trigger_id, "reason": "noise"})]),
        Reply(
            tool_calls=[
                ToolCall("reply", {"thread": asked.thread_id, "text": "That is out of scope."}),
                ToolCall("ignore", {"trigger": asked.trigger_id, "reason": "out of scope"}),
            ]
        ),
        Reply(content="Done."),
    )
    assert await router.turn() == 1
    (refused, replied, ignored) = await _decisions(pool)
    assert refused[:2] == ("ignore", False)
    assert "explicit request from alice" in refused[2]
    assert f"reply on {asked.thread_id}" in refused[2]
    assert (replied[0], replied[1]) == ("reply", True)
    assert (ignored[0], ignored[1]) == ("ignore", True)  # answered first: now it may be
    assert await replies_to(pool, asked.thread_id) == ["That is out of scope."]
    row = await _trigger(pool, asked.trigger_id)
    assert row["routed_at"] is not None
    assert row["undecidable_at"] is None


async def test_a_router_that_only_ever_ignores_a_request_still_answers_the_person(
    router: Router, intake: Intake, pool: asyncpg.Pool, fake_llm: FakeOpenAIServer, dsn: str
) -> None:
    """A model that insists on ``ignore``: each attempt ends at the second repeat, the
    request is set aside, and the person hears that the agent could not act."""

    def ignore_it(request: ChatRequest) -> Reply:
        (trigger,) = batch_of(request)
        return Reply(tool_calls=[ToolCall("ignore", {"trigger": trigger, "reason": "noise"})])

    asked = await ask(intake, 1, "@superagent add a CONTRIBUTORS file")
    fake_llm.respond_with(ignore_it)
    async with router_running(
        router, pool, dsn, settings=_settings(quarantine_after=2), retry_base=0.02
    ) as service:
        await assert_eventually(
            lambda: _undecidable(pool, asked.trigger_id), timeout=30, message="set aside"
        )
        assert not service.task.done()
    assert not [d for d in await _decisions(pool) if d[1]]  # no ignore was ever accepted
    (told,) = await replies_to(pool, asked.thread_id)
    assert "could not act" in told
    row = await _trigger(pool, asked.trigger_id)
    assert "must hear back" in row["route_error"]


async def test_a_reports_or_candidates_ignore_needs_no_reply(
    router: Router, intake: Intake, pool: asyncpg.Pool, fake_llm: FakeOpenAIServer
) -> None:
    """Only explicit requests must be answered: an inferred candidate (here alice's event,
    made one) may be ignored as before."""
    asked = await ask(intake, 1, "@superagent maybe look at this")
    await pool.execute("UPDATE triggers SET verdict = 'candidate' WHERE id = $1", asked.trigger_id)
    fake_llm.script(
        Reply(tool_calls=[ToolCall("ignore", {"trigger": asked.trigger_id, "reason": "noise"})]),
        Reply(content="Done."),
    )
    assert await router.turn() == 1
    assert [(tool, ok) for tool, ok, _ in await _decisions(pool)] == [("ignore", True)]
    assert await replies_to(pool, asked.thread_id) == []


async def test_a_model_that_falls_silent_after_a_refusal_is_asked_once_to_decide(
    router: Router, intake: Intake, pool: asyncpg.Pool, fake_llm: FakeOpenAIServer
) -> None:
    """The 1.5B model's way to give up (CI, 2026-12-07): ``create_ticket`` refused (a path
    as repo), then an empty answer, three turns running. Within the turn, a model that
    stops with events undecided is told once which, and how to decide them; here it then
    answers, and the request is decided in the same turn."""
    asked = await ask(intake, 1, "@superagent add a CONTRIBUTORS file")
    refused = {"title": "t", "scope": "s", "device": None, "repo": "demo"}
    fake_llm.script(
        Reply(tool_calls=[ToolCall("create_ticket", refused)]),
        Reply(content=""),
        Reply(tool_calls=[ToolCall("reply", {"thread": asked.thread_id, "text": "Which repo?"})]),
    )
    assert await router.turn() == 1
    nudged = fake_llm.chat_requests[2].last_user_message() or ""
    assert asked.trigger_id in nudged
    assert "undecided" in nudged
    assert "must be owner/name" in nudged  # the refusal it stopped at, said again
    row = await _trigger(pool, asked.trigger_id)
    assert row["routed_at"] is not None
    assert row["route_attempts"] == 0
    assert await replies_to(pool, asked.thread_id) == ["Which repo?"]


async def test_the_reminder_is_given_once_a_turn(
    router: Router, intake: Intake, pool: asyncpg.Pool, fake_llm: FakeOpenAIServer
) -> None:
    """A model that stays silent after the reminder fails the turn as before: one more
    call, not a loop."""
    asked = await ask(intake, 1, "@superagent add a CONTRIBUTORS file")
    fake_llm.respond_with(lambda request: Reply(content=""))
    with pytest.raises(TurnFailed) as failed:
        await router.turn()
    assert failed.value.trigger_ids == [asked.trigger_id]
    assert len(fake_llm.chat_requests) == 2  # the batch, and the one reminder


async def _reported(
    router: Router, intake: Intake, pool: asyncpg.Pool, fake_llm: FakeOpenAIServer, summary: str
) -> tuple[str, str, asyncpg.Record]:
    """alice's request, made a ticket by the router, whose worker reports it blocked: the
    thread, the ticket, and the report's event (id, text) in the router's inbox."""
    asked = await ask(intake, 1, "@superagent add a CONTRIBUTORS file")
    fake_llm.script(
        Reply(
            tool_calls=[
                ToolCall(
                    "create_ticket",
                    {
                        "title": "CONTRIBUTORS",
                        "scope": "as asked",
                        "threads": [],
                        "device": None,
                        "mandate_from": asked.trigger_id,
                    },
                )
            ]
        ),
        Reply(content="Done."),
    )
    assert await router.turn() == 1
    ticket_id = await pool.fetchval(
        "SELECT ticket_id FROM mandates WHERE trigger_id = $1", asked.trigger_id
    )
    assert ticket_id is not None
    await reports.finish(pool, ticket_id, None, {"status": "blocked", "summary": summary})
    report = await pool.fetchrow(
        "SELECT id, text FROM triggers WHERE kind = 'report.blocked' AND thread_id = $1",
        asked.thread_id,
    )
    assert report is not None
    return asked.thread_id, ticket_id, report


async def test_a_workers_report_the_router_cannot_pass_on_reaches_the_thread_as_written(
    router: Router, intake: Intake, pool: asyncpg.Pool, fake_llm: FakeOpenAIServer, dsn: str
) -> None:
    """The real 1.5B router (CI, 2026-12-07) answered a worker's report with nothing, three
    turns running: the report was set aside, and the person who asked never heard how the
    ticket ended. A report set aside is passed on as the worker wrote it, once."""
    summary = "the tests need a database this device cannot reach"
    thread_id, ticket_id, report = await _reported(router, intake, pool, fake_llm, summary)
    fake_llm.respond_with(lambda request: Reply(content=""))
    async with router_running(
        router, pool, dsn, settings=_settings(quarantine_after=2), retry_base=0.02
    ) as service:
        await assert_eventually(
            lambda: _undecidable(pool, report["id"]), timeout=30, message="set aside"
        )
        assert not service.task.done()
    told = await replies_to(pool, thread_id)
    assert told == [report["text"]]  # the report itself, once: ticket, status, summary
    assert ticket_id in told[0]
    assert summary in told[0]
    (alert,) = await admin_alerts(pool)
    assert report["id"] in alert


async def test_a_workers_report_is_not_ignored_until_its_thread_is_told(
    router: Router, intake: Intake, pool: asyncpg.Pool, fake_llm: FakeOpenAIServer
) -> None:
    thread_id, ticket_id, report = await _reported(
        router, intake, pool, fake_llm, "which branch should it go on?"
    )
    fake_llm.script(
        Reply(tool_calls=[ToolCall("ignore", {"trigger": report["id"], "reason": "seen"})]),
        Reply(tool_calls=[ToolCall("reply", {"thread": thread_id, "text": "It asks: which?"})]),
        Reply(content="Done."),
    )
    assert await router.turn() == 1
    refused, replied = (await _decisions(pool))[-2:]
    assert (refused[:2], replied[:2]) == (("ignore", False), ("reply", True))
    assert f"a report by the worker of {ticket_id}" in refused[2]
    assert f"pass it on with reply on {thread_id}" in refused[2]
    (told,) = await replies_to(pool, thread_id)
    assert told.startswith("It asks: which?")  # and the ticket's spend, below it
