"""People and their channel accounts: who is behind an event, whatever the channel.

``superagent users link alice github:octocat slack:U024BE7LH`` makes a GitHub comment by
octocat and a Slack message by U024BE7LH the same initiator: ingest resolves each event's
actor to its person (:class:`Directory`), the person's name counts in the policy's
allowlists, mandates record the person, and "my laptop" means a device that person owns.

A handle is matched, case-insensitively, against the actor's id or name as the channel
reports them (a GitHub login or numeric id, a Slack user id, a Matrix user id, a Lark
open_id, a web chat name).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

import asyncpg

from controlplane.errors import Conflict, InvalidInput, NotFound
from superagent_shared.ids import new_id

_REFRESH_SECONDS = 1.0
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,99}$")
SOURCES = ("github", "slack", "matrix", "lark", "web")


@dataclass(frozen=True)
class Person:
    id: str
    name: str


@dataclass(frozen=True)
class AccountRef:
    source: str
    handle: str

    def __str__(self) -> str:
        return f"{self.source}:{self.handle}"


def parse_account(text: str) -> AccountRef:
    """``source:handle`` (the handle may itself contain colons, as Matrix ids do)."""
    source, sep, handle = text.partition(":")
    source, handle = source.strip().lower(), handle.strip()
    if not sep or not handle:
        raise InvalidInput(f"{text!r} is not SOURCE:HANDLE (e.g. github:octocat)")
    if source not in SOURCES:
        raise InvalidInput(f"unknown channel {source!r}; one of: {', '.join(SOURCES)}")
    if len(handle) > 200:
        raise InvalidInput("a handle is at most 200 characters")
    return AccountRef(source, handle)


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise InvalidInput(
            f"{name!r} is not a person name: 1-100 of a-z 0-9 . _ -, starting with a letter "
            "or digit"
        )
    return name


async def link(pool: asyncpg.Pool, name: str, accounts: list[AccountRef]) -> Person:
    """Create ``name`` if new and link ``accounts`` to it (idempotent). An account already
    linked to someone else is refused: unlink it first."""
    check_name(name)
    async with pool.acquire() as conn, conn.transaction():
        row = await conn.fetchrow(
            "INSERT INTO people (id, name) VALUES ($1, $2) "
            "ON CONFLICT (name) DO UPDATE SET name = excluded.name RETURNING id, name",
            new_id("prs"),
            name,
        )
        assert row is not None
        person = Person(row["id"], row["name"])
        for account in accounts:
            owner = await conn.fetchval(
                "INSERT INTO accounts (source, handle, person_id) VALUES ($1, $2, $3) "
                "ON CONFLICT (source, handle) DO UPDATE SET source = excluded.source "
                "RETURNING (SELECT name FROM people WHERE id = accounts.person_id)",
                account.source,
                account.handle.casefold(),
                person.id,
            )
            if owner != person.name:
                raise Conflict(
                    f"{account} is linked to {owner}; run `superagent users unlink {account}` first"
                )
    return person


async def unlink(pool: asyncpg.Pool, account: AccountRef) -> str:
    """Unlink one account; returns the person it belonged to."""
    owner = await pool.fetchval(
        "DELETE FROM accounts a USING people p WHERE a.person_id = p.id "
        "AND a.source = $1 AND a.handle = $2 RETURNING p.name",
        account.source,
        account.handle.casefold(),
    )
    if owner is None:
        raise NotFound(f"{account} is not linked to anyone")
    return str(owner)


async def remove(pool: asyncpg.Pool, name: str) -> None:
    """Forget a person and their links (past triggers and mandates keep their actors)."""
    async with pool.acquire() as conn, conn.transaction():
        person_id = await conn.fetchval("SELECT id FROM people WHERE name = $1", name)
        if person_id is None:
            raise NotFound(f"no person {name!r}; `superagent users list` shows them")
        for table in ("triggers", "mandates"):
            await conn.execute(
                f"UPDATE {table} SET person_id = NULL WHERE person_id = $1",
                person_id,
            )
        await conn.execute("DELETE FROM people WHERE id = $1", person_id)


async def everyone(pool: asyncpg.Pool) -> dict[str, list[str]]:
    """Person name → their accounts (``source:handle``), sorted."""
    rows = await pool.fetch(
        "SELECT p.name, a.source, a.handle FROM people p "
        "LEFT JOIN accounts a ON a.person_id = p.id ORDER BY p.name, a.source, a.handle"
    )
    people: dict[str, list[str]] = {}
    for row in rows:
        accounts = people.setdefault(row["name"], [])
        if row["source"] is not None:
            accounts.append(f"{row['source']}:{row['handle']}")
    return people


class Directory:
    """Every account → person, re-read at most once a second (links apply within 1 s).

    The whole table is small (people × channels), so one query per second per replica
    beats a lookup per event on the ingest path.
    """

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self._loaded_at = float("-inf")
        self._by_account: dict[tuple[str, str], Person] = {}

    async def resolve(self, source: str, actor_id: str, actor_name: str) -> Person | None:
        if time.monotonic() - self._loaded_at >= _REFRESH_SECONDS:
            rows = await self.pool.fetch(
                "SELECT a.source, a.handle, p.id, p.name FROM accounts a "
                "JOIN people p ON p.id = a.person_id"
            )
            self._by_account = {
                (row["source"], row["handle"]): Person(row["id"], row["name"]) for row in rows
            }
            self._loaded_at = time.monotonic()
        for handle in (actor_id, actor_name):
            person = self._by_account.get((source, handle.casefold()))
            if person is not None:
                return person
        return None

    def forget(self) -> None:
        self._loaded_at = float("-inf")
