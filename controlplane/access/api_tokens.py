"""Named API tokens: one per person or script, so that what is done over the HTTP API is
done by someone.

The admin token is one shared secret, and everyone holding it is "admin". A named token
(``superagent tokens create alice``) opens the same API, and its name is who acted: the
audit identity of a ticket stopped or a device revoked with it, which ``--by`` flags and
self-declared names are not. ``superagent login`` keeps one in a context.

A token is ``sat_`` and 43 random URL-safe characters. Only its SHA-256 is stored (it is
random, so a fast hash is enough: there is nothing to guess), so a read of the table opens
nothing; it is found by that hash. Revoked, its row stays: who had it, and until when.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from controlplane.db.pool import Db
from controlplane.errors import Conflict, InvalidInput, NotFound
from superagent_shared.ids import new_id

PREFIX = "sat_"  # a token says what it is, for secret scanners and for people
_SECRET_BYTES = 32
# Names are identities in records and messages: plain, short, no spaces or markup.
NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}", re.IGNORECASE)
RESERVED = frozenset({"admin"})  # the admin token's holder


@dataclass(frozen=True)
class TokenView:
    id: str
    name: str
    created_by: str
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


def _hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def check_name(name: str) -> str:
    if not NAME.fullmatch(name):
        raise InvalidInput(
            f"{name!r} is not a token name: letters, digits, '.', '_' and '-', "
            "starting with a letter or digit, at most 63 characters"
        )
    if name.lower() in RESERVED:
        raise InvalidInput(f"{name!r} is the admin token's holder; pick a person's name")
    return name


async def create(db: Db, name: str, *, created_by: str) -> str:
    """A new token named ``name``; the secret, which is shown this once and never again.
    Conflict if a live token has that name."""
    check_name(name)
    secret = PREFIX + secrets.token_urlsafe(_SECRET_BYTES)
    try:
        await db.execute(
            "INSERT INTO api_tokens (id, name, secret_hash, created_by) VALUES ($1, $2, $3, $4)",
            new_id("tok"),
            name,
            _hash(secret),
            created_by,
        )
    except asyncpg.UniqueViolationError:
        raise Conflict(
            f"a token named {name!r} exists; revoke it first (superagent tokens revoke {name})"
        ) from None
    return secret


async def holder(db: Db, presented: str) -> str | None:
    """The name of the live token ``presented`` is, or None."""
    if not presented.startswith(PREFIX):
        return None
    found = await db.fetchval(
        "UPDATE api_tokens SET last_used_at = now() "
        "WHERE secret_hash = $1 AND revoked_at IS NULL RETURNING name",
        _hash(presented),
    )
    return None if found is None else str(found)


async def listing(db: Db, *, everything: bool = False) -> list[TokenView]:
    rows = await db.fetch(
        "SELECT id, name, created_by, created_at, last_used_at, revoked_at FROM api_tokens "
        "WHERE $1 OR revoked_at IS NULL ORDER BY revoked_at IS NOT NULL, name, created_at",
        everything,
    )
    return [TokenView(**dict(row)) for row in rows]


async def revoke(db: Db, name: str) -> None:
    """The live token named ``name`` opens nothing from now on; NotFound if there is none."""
    done = await db.fetchval(
        "UPDATE api_tokens SET revoked_at = now() WHERE name = $1 AND revoked_at IS NULL "
        "RETURNING id",
        name,
    )
    if done is None:
        raise NotFound(f"no live token named {name!r} (superagent tokens list)")
