"""Assignments: one execution round of a ticket, held by one replica through a lease.

Starting a round takes a slot at once, in the same transaction that creates it:
``max_workers`` regular slots, shared by every replica, plus one kept for workers woken by a
human message (so a person is answered even when every regular slot is busy). The slot
count is serialised by an advisory transaction lock, which is held for one short statement
sequence and never across a model call.

A round keeps its slot while it runs, including while its turn is over but background jobs
still run; it gives it back when it ends (a report to people, waiting for a device, a
limit, a stop). A replica renews the leases of the rounds it runs; a round whose lease
expires (its replica died) is taken over by another replica, which resumes the same
session. The one writer of ``assignments``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import asyncpg

from controlplane.db.pool import Db
from controlplane.tickets import store
from superagent_shared.ids import new_id

_SLOT_LOCK = 0x5A_0007  # pg_advisory_xact_lock key: counting and taking slots is serial


@dataclass(frozen=True)
class Assignment:
    id: str
    ticket_id: str
    session_id: str | None
    slot: str
    woken_by: str
    turns: int
    taken_over: bool = False


def _assignment(row: asyncpg.Record, *, taken_over: bool = False) -> Assignment:
    return Assignment(
        id=row["id"],
        ticket_id=row["ticket_id"],
        session_id=row["session_id"],
        slot=row["slot"],
        woken_by=row["woken_by"],
        turns=row["turns"],
        taken_over=taken_over,
    )


_COLUMNS = "id, ticket_id, session_id, slot, woken_by, turns"


async def start(
    pool: asyncpg.Pool,
    ticket_id: str,
    *,
    states: tuple[str, ...],
    woken_by: str,
    owner: str,
    lease: timedelta,
    max_workers: int,
    human: bool,
) -> Assignment | None:
    """A new round for a ticket still in one of ``states``, if a slot is free.

    The round reuses the ticket's session (retries keep their context). None when no slot
    is free, or the ticket moved on meanwhile (another replica started it).
    """
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _SLOT_LOCK)
        used: dict[str, int] = {
            row["slot"]: row["n"]
            for row in await conn.fetch(
                "SELECT slot, count(*) AS n FROM assignments WHERE ended_at IS NULL GROUP BY slot"
            )
        }
        if used.get("regular", 0) < max_workers:
            slot = "regular"
        elif human and not used.get("human", 0):
            slot = "human"
        else:
            return None
        if not await store.start_round(conn, ticket_id, states):
            return None
        session_id = await conn.fetchval(
            "SELECT session_id FROM assignments WHERE ticket_id = $1 AND session_id IS NOT NULL "
            "ORDER BY created_at DESC LIMIT 1",
            ticket_id,
        )
        row = await conn.fetchrow(
            "INSERT INTO assignments (id, ticket_id, session_id, lease_owner, lease_expires_at, "
            "slot, woken_by) VALUES ($1, $2, $3, $4, now() + $5::interval, $6, $7) "
            f"RETURNING {_COLUMNS}",
            new_id("asg"),
            ticket_id,
            session_id,
            owner,
            lease,
            slot,
            woken_by,
        )
        assert row is not None
        return _assignment(row)


async def take_over(pool: asyncpg.Pool, *, owner: str, lease: timedelta) -> Assignment | None:
    """One round whose lease expired (its replica is gone), now this replica's."""
    row = await pool.fetchrow(
        "UPDATE assignments SET lease_owner = $1, lease_expires_at = now() + $2::interval "
        "WHERE id = (SELECT id FROM assignments WHERE ended_at IS NULL "
        "            AND lease_expires_at < now() ORDER BY lease_expires_at LIMIT 1 "
        "            FOR UPDATE SKIP LOCKED) "
        f"RETURNING {_COLUMNS}",
        owner,
        lease,
    )
    return None if row is None else _assignment(row, taken_over=True)


async def renew(
    pool: asyncpg.Pool, owner: str, assignment_ids: list[str], lease: timedelta
) -> set[str]:
    """Renew this replica's leases; returns the ids still held (the others were lost:
    ended by a stop, or taken over after a renewal came too late)."""
    if not assignment_ids:
        return set()
    rows = await pool.fetch(
        "UPDATE assignments SET lease_expires_at = now() + $3::interval "
        "WHERE id = ANY($2::text[]) AND lease_owner = $1 AND ended_at IS NULL RETURNING id",
        owner,
        assignment_ids,
        lease,
    )
    return {row["id"] for row in rows}


async def end(conn: Db, assignment_id: str, outcome: str) -> bool:
    """The round is over: its slot is free. False if it had already ended."""
    done = await conn.fetchval(
        "UPDATE assignments SET ended_at = now(), outcome = $2, lease_expires_at = NULL "
        "WHERE id = $1 AND ended_at IS NULL RETURNING id",
        assignment_id,
        outcome[:50],
    )
    return done is not None


async def release(pool: asyncpg.Pool, owner: str, assignment_ids: list[str]) -> None:
    """This replica stops: its rounds may be taken over at once instead of at lease end."""
    if assignment_ids:
        await pool.execute(
            "UPDATE assignments SET lease_expires_at = now() "
            "WHERE id = ANY($2::text[]) AND lease_owner = $1 AND ended_at IS NULL",
            owner,
            assignment_ids,
        )


async def set_session(conn: Db, assignment_id: str, session_id: str) -> None:
    """The round's model session (a new one, made at its start)."""
    await conn.execute(
        "UPDATE assignments SET session_id = $2 WHERE id = $1", assignment_id, session_id
    )


async def count_turns(conn: Db, assignment_id: str, turns: int) -> None:
    await conn.execute("UPDATE assignments SET turns = $2 WHERE id = $1", assignment_id, turns)


async def hand_over(db: Db, ticket_id: str) -> str | None:
    """End the holding replica's lease on the ticket's round now (the watchdog's requeue):
    another replica takes it over. The round's id, None when none runs."""
    moved = await db.fetchval(
        "UPDATE assignments SET lease_owner = 'watchdog', lease_expires_at = now() "
        "WHERE ticket_id = $1 AND ended_at IS NULL RETURNING id",
        ticket_id,
    )
    return None if moved is None else str(moved)
