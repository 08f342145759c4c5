"""People and their channel accounts: who is behind an event, whatever the channel.

``superagent users link alice github:octocat slack:alice@acme.example`` makes a GitHub
comment by octocat's account and a Slack message by that Slack member the same initiator:
ingest resolves each event's actor to its person (:class:`Directory`), the person's name
counts in the policy's allowlists, mandates record the person, and "my laptop" means a
device that person owns.

An account is stored, and matched, by the channel's immutable actor id only
(:mod:`controlplane.identities`: a GitHub numeric id, a Slack TEAM/USER, a Lark open_id, a
Matrix id, ``web:admin``), exactly as the adapter reports it; never by a name or handle,
which can be chosen, renamed or registered again by someone else. The CLI resolves a handle
to its id once, when linking (:mod:`controlplane.handles`), and keeps the handle as the
account's label, for display. This module stores what it is given: it does no I/O beyond
the database.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

import asyncpg

from controlplane import identities
from controlplane.errors import Conflict, InvalidInput, NotFound
from superagent_shared.ids import new_id

_REFRESH_SECONDS = 1.0
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,99}$")
SOURCES = identities.SOURCES


@dataclass(frozen=True)
class Person:
    id: str
    name: str


@dataclass(frozen=True)
class AccountRef:
    """One channel account: its source and ``handle``, the actor id the channel gives it
    (once resolved; as typed, before). ``label`` is the handle it was linked by, shown
    beside the id and never matched."""

    source: str
    handle: str
    label: str | None = None

    def __str__(self) -> str:
        return identities.account_text(self.source, self.handle)


def parse_account(text: str) -> AccountRef:
    """``source:handle`` as typed (the handle may itself contain colons, as Matrix ids do);
    still to be resolved to an id (:func:`controlplane.handles.Resolver.account`)."""
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
    # Allowlists hold ids and person names side by side: a name must not read as an id.
    looks = identities.source_of(name)
    if looks is not None:
        raise InvalidInput(f"{name!r} reads as a {looks} id; choose a person name that does not")
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
            # Ids are stored as the channel gives them: matched exactly, never casefolded.
            owner = await conn.fetchval(
                "INSERT INTO accounts (source, handle, person_id, label) VALUES ($1, $2, $3, $4) "
                "ON CONFLICT (source, handle) DO UPDATE SET "
                "label = coalesce(excluded.label, accounts.label) "
                "WHERE accounts.person_id = excluded.person_id "
                "RETURNING (SELECT name FROM people WHERE id = accounts.person_id)",
                account.source,
                account.handle,
                person.id,
                account.label,
            )
            if owner is None:  # linked to someone else: the update did not apply
                owner = await conn.fetchval(
                    "SELECT p.name FROM accounts a JOIN people p ON p.id = a.person_id "
                    "WHERE a.source = $1 AND a.handle = $2",
                    account.source,
                    account.handle,
                )
            if owner != person.name:
                raise Conflict(
                    f"{account} is linked to {owner}; run `superagent users unlink {account}` first"
                )
    return person


async def unlink(pool: asyncpg.Pool, account: AccountRef) -> str:
    """Unlink one account, named by its id or by the handle it was linked by (its label:
    removing a link needs no lookup); returns the person it belonged to."""
    typed = account.handle
    ids = [typed, identities.account_text(account.source, typed)]
    async with pool.acquire() as conn, conn.transaction():
        rows = await conn.fetch(
            "SELECT handle FROM accounts WHERE source = $1 AND handle = ANY($2::text[]) "
            "UNION SELECT handle FROM accounts WHERE source = $1 AND lower(label) = lower($3)",
            account.source,
            ids,
            typed,
        )
        exact = [row["handle"] for row in rows if row["handle"] in ids]
        found = exact or [row["handle"] for row in rows]
        if len(found) > 1:
            named = ", ".join(identities.account_text(account.source, h) for h in found)
            raise Conflict(f"{account} labels several accounts ({named}); unlink one by its id")
        if not found:
            raise NotFound(f"{account} is not linked to anyone")
        owner = await conn.fetchval(
            "DELETE FROM accounts a USING people p WHERE a.person_id = p.id "
            "AND a.source = $1 AND a.handle = $2 RETURNING p.name",
            account.source,
            found[0],
        )
    return str(owner)


async def remove(pool: asyncpg.Pool, name: str) -> None:
    """Forget a person and their links (past triggers and mandates keep their actors)."""
    async with pool.acquire() as conn, conn.transaction():
        person_id = await conn.fetchval("SELECT id FROM people WHERE name = $1", name)
        if person_id is None:
            raise NotFound(f"no person {name!r}; `superagent users list` shows them")
        # Their past requests keep their actors, only the link to the person goes.
        await conn.execute("UPDATE triggers SET person_id = NULL WHERE person_id = $1", person_id)
        await conn.execute("UPDATE mandates SET person_id = NULL WHERE person_id = $1", person_id)
        await conn.execute("DELETE FROM people WHERE id = $1", person_id)


async def everyone(pool: asyncpg.Pool) -> dict[str, list[str]]:
    """Person name → their accounts (``source:id``, with ``(label)`` when linked by a
    handle), sorted."""
    rows = await pool.fetch(
        "SELECT p.name, a.source, a.handle, a.label FROM people p "
        "LEFT JOIN accounts a ON a.person_id = p.id ORDER BY p.name, a.source, a.handle"
    )
    people: dict[str, list[str]] = {}
    for row in rows:
        accounts = people.setdefault(row["name"], [])
        if row["source"] is not None:
            text = identities.account_text(row["source"], row["handle"])
            accounts.append(f"{text} ({row['label']})" if row["label"] else text)
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

    async def resolve(self, source: str, actor_id: str) -> Person | None:
        """The person linked to the account with this actor id (never by a name)."""
        if time.monotonic() - self._loaded_at >= _REFRESH_SECONDS:
            rows = await self.pool.fetch(
                "SELECT a.source, a.handle, p.id, p.name FROM accounts a "
                "JOIN people p ON p.id = a.person_id"
            )
            self._by_account = {
                (row["source"], row["handle"]): Person(row["id"], row["name"]) for row in rows
            }
            self._loaded_at = time.monotonic()
        return self._by_account.get((source, actor_id))

    def forget(self) -> None:
        self._loaded_at = float("-inf")
