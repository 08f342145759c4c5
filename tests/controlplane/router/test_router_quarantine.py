"""Fault containment in the router: a turn that fails is that batch's failure, never the
service's; a poison event is isolated and set aside as undecidable, the admin told once;
an unreachable model counts against nobody, and each waiting thread is told once.

Real parts throughout: Postgres, the fake OpenAI server over HTTP, the official client, a
real RouterService under its own leadership.
"""

from __future__ import annotations

import logging
from typing import Any

import asyncpg
import pytest

from controlplane.db.urls import asyncpg_dsn
from controlplane.ingest.intake import Intake
from controlplane.router.router import Router
from controlplane.router.tools.toolbox import Toolbox
from controlplane.settings import LlmSettings, RouterSettings, Settings, WatchdogSettings
from tests.fakes.openai_server import (
    ChatRequest,
    FakeOpenAIServer,
    Reply,
    fault,
)
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
    tickets_for_batch,
)

FAST = QUICK_LLM
ADMIN = "web:admin"
POISON = "please parse this poison pill"


def _settings(quarantine_after: int = 2, notice: float = 60.0) -> Settings:
    return Settings(
        llm=LlmSettings(**FAST),
        router=RouterSettings(quarantine_after=quarantine_after, model_notice_seconds=notice),
        watchdog=WatchdogSettings(admin_thread=ADMIN),
    )


def _decide(request: ChatRequest) -> Reply:
    """The model that works: a ticket for each trigger, then done."""
    if not fresh(request):
        return Reply(content="Done.")
    return tickets_for_batch(request)


async def _trigger(pool: asyncpg.Pool, trigger_id: str) -> asyncpg.Record:
    row = await pool.fetchrow(
        "SELECT id, thread_id, routed_at, undecidable_at, route_attempts, route_error, "
        "model_notice_at FROM triggers WHERE id = $1",
        trigger_id,
    )
    assert row is not None
    return row


async def _undecidable(pool: asyncpg.Pool, *trigger_ids: str) -> bool:
    count = await pool.fetchval(
        "SELECT count(*) FROM triggers WHERE id = ANY($1::text[]) AND undecidable_at IS NOT NULL "
        "AND routed_at IS NOT NULL",
        list(trigger_ids),
    )
    return bool(count == len(trigger_ids))


async def test_a_batch_whose_every_answer_is_malformed_ends_undecidable_not_the_service(
    router: Router, intake: Intake, pool: asyncpg.Pool, fake_llm: FakeOpenAIServer, dsn: str
) -> None:
    fake_llm.respond_with(lambda request: fault("empty_choices"))  # type: ignore[arg-type,return-value]
    async with router_running(
        router, pool, dsn, settings=_settings(quarantine_after=2), retry_base=0.02
    ) as service:
        asked = [await ask(intake, n) for n in (1, 2)]
        ids = [a.trigger_id for a in asked]
        await assert_eventually(
            lambda: _undecidable(pool, *ids), timeout=30, message="both set aside"
        )
        assert not service.task.done(), "the router loop ended"
    for trigger_id in ids:
        row = await _trigger(pool, trigger_id)
        assert row["route_attempts"] == 2
        assert "malformed" in row["route_error"]
        failures = await pool.fetch(
            "SELECT error_class, quarantined FROM item_failures WHERE loop = 'router' "
            "AND item_id LIKE '%' || $1 || '%'",
            trigger_id,
        )
        assert failures
        assert all(f["error_class"] == "malformed" for f in failures)
        assert sum(f["quarantined"] for f in failures) == 1
        # One line, once: the request is not left unanswered, and there is no reply storm.
        (told,) = await replies_to(pool, row["thread_id"])
        assert "could not act" in told
    alerts = await admin_alerts(pool)
    assert len(alerts) == 2
    for trigger_id in ids:
        (alert,) = [a for a in alerts if trigger_id in a]
        assert "malformed" in alert
        assert f"superagent triggers retry {trigger_id}" in alert


async def test_a_poison_event_is_isolated_and_the_good_ones_in_its_batch_are_decided(
    router: Router, intake: Intake, pool: asyncpg.Pool, fake_llm: FakeOpenAIServer, dsn: str
) -> None:
    def respond(request: ChatRequest) -> Reply:
        if POISON in (request.last_user_message() or "") and fresh(request):
            return fault("empty_choices")  # type: ignore[return-value]
        return _decide(request)

    # The first three arrive before the router leads: they form one batch.
    good1 = await ask(intake, 1)
    poison = await ask(intake, 2, f"@superagent {POISON}")
    good2 = await ask(intake, 3)
    fake_llm.respond_with(respond)
    async with router_running(
        router, pool, dsn, settings=_settings(quarantine_after=2), retry_base=0.02
    ) as service:
        await assert_eventually(
            lambda: _undecidable(pool, poison.trigger_id), timeout=30, message="poison aside"
        )

        async def all_routed() -> bool:
            return bool(
                await pool.fetchval("SELECT count(*) FROM triggers WHERE routed_at IS NULL") == 0
            )

        await assert_eventually(all_routed, timeout=30, message="the good ones decided")
        assert not service.task.done()
    assert batch_of(fake_llm.chat_requests[0]) == [
        good1.trigger_id,
        poison.trigger_id,
        good2.trigger_id,
    ]
    for good in (good1, good2):
        row = await _trigger(pool, good.trigger_id)
        assert row["routed_at"] is not None
        assert row["undecidable_at"] is None
        assert await pool.fetchval(
            "SELECT count(*) FROM mandates WHERE trigger_id = $1", good.trigger_id
        )
    # The good ones were decided alone, each in its own turn, never with the poison again.
    later = [batch_of(r) for r in fake_llm.chat_requests[1:] if batch_of(r)]
    assert all(len(b) == 1 for b in later)
    assert len(await admin_alerts(pool)) == 1


async def test_an_exception_in_our_own_code_ends_the_item_not_the_service(
    router: Router,
    intake: Intake,
    pool: asyncpg.Pool,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def broken(self: Toolbox, name: str, arguments: Any, turn: Any) -> Any:
        raise IndexError("list index out of range")

    monkeypatch.setattr(Toolbox, "call", broken)
    fake_llm.respond_with(_decide)
    caplog.set_level(logging.WARNING, logger="controlplane.router.router")
    async with router_running(
        router, pool, dsn, settings=_settings(quarantine_after=2), retry_base=0.02
    ) as service:
        asked = await ask(intake, 1)
        await assert_eventually(
            lambda: _undecidable(pool, asked.trigger_id), timeout=30, message="set aside"
        )
        assert not service.task.done()
    rows = await pool.fetch(
        "SELECT error_class, error FROM item_failures WHERE item_id = $1", asked.trigger_id
    )
    assert {r["error_class"] for r in rows} == {"internal"}
    assert "IndexError" in rows[0]["error"]
    assert "Traceback" in caplog.text
    assert "IndexError" in caplog.text
    row = await _trigger(pool, asked.trigger_id)
    assert row["route_error"] == "internal: IndexError: list index out of range"


async def test_an_unreachable_model_counts_against_nobody_and_each_thread_is_told_once(
    router: Router, intake: Intake, pool: asyncpg.Pool, fake_llm: FakeOpenAIServer, dsn: str
) -> None:
    down = True

    def respond(request: ChatRequest) -> Reply:
        if down:
            return fault("server_error")  # type: ignore[return-value]
        return _decide(request)

    fake_llm.respond_with(respond)
    async with router_running(
        router, pool, dsn, settings=_settings(quarantine_after=1, notice=1.0), retry_base=0.02
    ) as service:
        first = await ask(intake, 1)
        second = await ask(intake, 1, "@superagent and also this")  # the same thread
        other = await ask(intake, 2)
        threads = {first.thread_id, other.thread_id}
        assert len(threads) == 2
        assert second.thread_id == first.thread_id

        async def everyone_told() -> bool:
            return all([await replies_to(pool, thread) for thread in threads])

        await assert_eventually(everyone_told, timeout=20, message="each thread told")
        calls = await pool.fetchval("SELECT count(*) FROM llm_calls")
        await assert_eventually(
            lambda: _calls_beyond(pool, calls + 4), timeout=20, message="more failed turns"
        )
        for thread in threads:
            (notice,) = await replies_to(pool, thread)
            assert "can't reach my model" in notice
        for asked in (first, second, other):
            row = await _trigger(pool, asked.trigger_id)
            assert row["route_attempts"] == 0
            assert row["routed_at"] is None
            assert row["model_notice_at"] is not None
        assert await pool.fetchval("SELECT count(*) FROM item_failures") == 0
        assert len(await admin_alerts(pool)) == 1  # one per outage episode
        down = False

        async def decided() -> bool:
            return bool(
                await pool.fetchval("SELECT count(*) FROM triggers WHERE routed_at IS NULL") == 0
            )

        await assert_eventually(decided, timeout=20, message="the queue decided")
        assert not service.task.done()
    assert (
        await pool.fetchval("SELECT count(*) FROM triggers WHERE undecidable_at IS NOT NULL") == 0
    )
    handled = await pool.fetchval(
        "SELECT count(DISTINCT g.thread_id) FROM mandates m JOIN triggers g ON g.id = m.trigger_id"
    )
    assert handled == 2  # a ticket for each thread
    for thread in threads:
        assert len(await replies_to(pool, thread)) == 1


async def _calls_beyond(pool: asyncpg.Pool, count: int) -> bool:
    return bool(await pool.fetchval("SELECT count(*) FROM llm_calls") >= count)


@pytest.mark.parametrize("kind", ["unauthorized", "model_not_found"])
async def test_a_bad_key_or_unknown_model_quarantines_nothing(
    kind: str,
    router: Router,
    intake: Intake,
    pool: asyncpg.Pool,
    fake_llm: FakeOpenAIServer,
    dsn: str,
) -> None:
    fake_llm.respond_with(lambda request: fault(kind))  # type: ignore[arg-type,return-value]
    async with router_running(
        router, pool, dsn, settings=_settings(quarantine_after=1), retry_base=0.02
    ) as service:
        asked = await ask(intake, 1)
        await assert_eventually(
            lambda: _calls_beyond(pool, 4), timeout=20, message="several failed turns"
        )
        assert not service.task.done()
    row = await _trigger(pool, asked.trigger_id)
    assert row["route_attempts"] == 0
    assert row["routed_at"] is None
    assert row["undecidable_at"] is None
    assert await pool.fetchval("SELECT count(*) FROM item_failures") == 0


async def test_a_rejected_request_counts_and_is_set_aside(
    router: Router, intake: Intake, pool: asyncpg.Pool, fake_llm: FakeOpenAIServer, dsn: str
) -> None:
    fake_llm.respond_with(
        lambda request: Reply(error_status=400, error_message="invalid 'messages'")
    )
    async with router_running(
        router, pool, dsn, settings=_settings(quarantine_after=2), retry_base=0.02
    ):
        asked = await ask(intake, 1)
        await assert_eventually(
            lambda: _undecidable(pool, asked.trigger_id), timeout=30, message="set aside"
        )
    assert "permanent" in (await _trigger(pool, asked.trigger_id))["route_error"]


async def test_triggers_retry_puts_an_undecidable_event_back_and_the_next_turn_decides_it(
    router: Router,
    intake: Intake,
    pool: asyncpg.Pool,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    database_url: str,
) -> None:
    broken = True

    def respond(request: ChatRequest) -> Reply:
        if broken:
            return fault("empty_choices")  # type: ignore[return-value]
        return _decide(request)

    fake_llm.respond_with(respond)
    async with router_running(
        router, pool, dsn, settings=_settings(quarantine_after=1), retry_base=0.02
    ) as service:
        asked = await ask(intake, 1)
        await assert_eventually(
            lambda: _undecidable(pool, asked.trigger_id), timeout=30, message="set aside"
        )
        listed = run_cli(database_url, "triggers", "list", "--undecidable")
        assert listed.returncode == 0, listed.stderr
        assert asked.trigger_id in listed.stdout
        shown = run_cli(database_url, "triggers", "show", asked.trigger_id)
        assert shown.returncode == 0, shown.stderr
        assert "malformed" in shown.stdout
        broken = False
        retried = run_cli(database_url, "triggers", "retry", asked.trigger_id)
        assert retried.returncode == 0, retried.stderr
        assert asked.trigger_id in retried.stdout

        async def decided() -> bool:
            return bool(
                await pool.fetchval(
                    "SELECT count(*) FROM mandates WHERE trigger_id = $1", asked.trigger_id
                )
            )

        await assert_eventually(decided, timeout=20, message="decided after the retry")
        assert not service.task.done()
    row = await _trigger(pool, asked.trigger_id)
    assert row["undecidable_at"] is None
    assert row["routed_at"] is not None
    again = run_cli(database_url, "triggers", "retry", asked.trigger_id)  # not undecidable
    assert again.returncode == 1
    assert "not undecidable" in again.stderr
    assert "Traceback" not in again.stderr


@pytest.mark.parametrize("bad", ["trg_000000000000", "nonsense", ""])
def test_triggers_retry_of_an_unknown_id_is_a_clean_error(bad: str, database_url: str) -> None:
    result = run_cli(database_url, "triggers", "retry", bad)
    assert result.returncode == 1
    assert result.stderr.startswith("error: ")
    assert "Traceback" not in result.stderr
    shown = run_cli(database_url, "triggers", "show", bad)
    assert shown.returncode == 1
    assert "Traceback" not in shown.stderr


class _RestartingDatabase:
    """A turn taker whose database restarts under it: asyncpg's errors of a cut connection,
    which are not ``PostgresError``s, then a turn that works."""

    def __init__(self) -> None:
        self.errors: list[Exception] = [
            asyncpg.InterfaceError("connection is closed"),
            asyncpg.exceptions.InternalClientError("another operation is in progress"),
        ]
        self.turns = 0

    async def turn(self, leading: Any = None) -> int:
        self.turns += 1
        if self.errors:
            raise self.errors.pop(0)
        return 0


async def test_a_database_restart_during_a_turn_is_an_outage_not_a_bug(
    pool: asyncpg.Pool, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The errors a Postgres restart raises mid-turn are retried as the database's trouble;
    none is logged as "a bug" with a traceback, and the loop goes on to the next turn."""
    from controlplane.leadership import Leadership
    from controlplane.router.service import RouterService

    caplog.set_level(logging.WARNING)
    leadership = Leadership(pool, "me", lease_seconds=10, renew_seconds=1)
    restarting = _RestartingDatabase()
    service = RouterService(
        restarting, leadership, asyncpg_dsn(database_url), pool, retry_base=0.05, max_backoff=0.1
    )
    await leadership.start()
    await service.start()
    try:
        await assert_eventually(lambda: restarting.turns >= 3, timeout=15, message="turns")
    finally:
        await service.stop()
        await leadership.stop()
    bugs = [r.getMessage() for r in caplog.records if "(a bug)" in r.getMessage()]
    assert not bugs, bugs
