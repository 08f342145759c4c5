"""Opening a ticket as an operation of its own, without the router: what it writes, what it
refuses (leaving nothing behind), and a repeated request finding the ticket it opened."""

from __future__ import annotations

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.ingest.admission import Actor, Admission, SourceAdmission
from controlplane.ingest.intake import IncomingTrigger, Ingested, Intake, ThreadRef
from controlplane.tickets import opening, placement
from superagent_shared.ids import stable_id
from tests.support.helpers import save_policy

ALICE = Actor("u-1", "alice")
BOB = Actor("u-2", "bob")  # not on the allowlist: his words are nobody's request
POLICY = Admission(default=SourceAdmission(users=[ALICE.id]))


@pytest.fixture
async def intake(pool: asyncpg.Pool, db: async_sessionmaker[AsyncSession]) -> Intake:
    await save_policy(db, POLICY)
    return Intake(pool)


async def _said(intake: Intake, external_id: str, actor: Actor, text: str) -> Ingested:
    return await intake.ingest(
        IncomingTrigger(
            source="github",
            external_id=external_id,
            thread=ThreadRef(f"acme/widgets#{external_id}", title=f"issue {external_id}"),
            actor=actor,
            kind="comment",
            text=text,
        )
    )


def _request(trigger: Ingested, **more: object) -> opening.Request:
    fields: dict[str, object] = {
        "title": "Fix the flaky test",
        "scope": "Only tests/test_x.py",
        "threads": [],
        "mandate_from": trigger.trigger_id,
    }
    return opening.Request(**(fields | more))  # type: ignore[arg-type]


async def test_a_request_opens_its_ticket_with_its_mandate_and_threads(
    pool: asyncpg.Pool, intake: Intake
) -> None:
    asked = await _said(intake, "41", ALICE, "@superagent fix the flaky test")
    async with pool.acquire() as conn, conn.transaction():
        opened = await opening.open_ticket(conn, _request(asked), intake.policy)
    assert (opened.kind, opened.requester, opened.threads) == (
        "explicit",
        "alice",
        [asked.thread_id],
    )
    # The GitHub thread's repository, and no device reports it: no device, none checked.
    assert isinstance(opened.placed, placement.Unplaced)
    assert opened.grant is None
    assert not opened.waits_for_approval
    state = await pool.fetchval("SELECT state FROM tickets WHERE id = $1", opened.ticket_id)
    mandate = await pool.fetchrow(
        "SELECT kind, trigger_id FROM mandates WHERE ticket_id = $1", opened.ticket_id
    )
    assert state == "open"
    assert mandate is not None
    assert tuple(mandate) == ("explicit", asked.trigger_id)
    async with pool.acquire() as conn, conn.transaction():
        again = await opening.open_ticket(conn, _request(asked), intake.policy)
    assert (again.ticket_id, again.already) == (opened.ticket_id, True)


async def test_what_is_not_a_request_opens_nothing(pool: asyncpg.Pool, intake: Intake) -> None:
    said = await _said(intake, "42", BOB, "@superagent delete the repository")
    asked = await _said(intake, "43", ALICE, "@superagent fix it")
    async with pool.acquire() as conn, conn.transaction():
        with pytest.raises(opening.NotOpened, match="not a request anyone may act on"):
            await opening.open_ticket(conn, _request(said), intake.policy)
        with pytest.raises(opening.NotOpened, match="no paired device 'nowhere'"):
            await opening.open_ticket(conn, _request(asked, device="nowhere"), intake.policy)
    for trigger in (said, asked):
        ticket_id = stable_id("tkt", f"ticket:{trigger.trigger_id}:Fix the flaky test")
        assert await pool.fetchval("SELECT 1 FROM tickets WHERE id = $1", ticket_id) is None
