"""Immutable, versioned documents (prompts and policies): every save is a new version.

A save names the version it was based on. If another save landed since, it is refused with
a Conflict naming both, so two people editing at once never silently overwrite each other.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from controlplane.db.pool import Db, transaction
from controlplane.errors import Conflict, NotFound
from superagent_shared.ids import new_id


@dataclass(frozen=True)
class Kind:
    """One table of versions: its name, its ids' prefix, and its body's column type."""

    table: str
    prefix: str
    body_type: str  # jsonb: a JSON document; text: as written


POLICY = Kind("policy_versions", "pol", "jsonb")
PROMPT = Kind("prompt_versions", "prm", "text")


@dataclass(frozen=True)
class Version:
    id: str
    name: str
    version: int
    base_id: str | None
    body: Any  # a policy's JSON document, a prompt's text
    author: str
    created_at: datetime


# The body as text whatever its type: decoded here, not by the connection's codecs.
_COLUMNS = "id, name, version, base_id, body::text AS body, author, created_at"


def _version(kind: Kind, row: asyncpg.Record) -> Version:
    body = row["body"]
    return Version(
        id=row["id"],
        name=row["name"],
        version=row["version"],
        base_id=row["base_id"],
        body=json.loads(body) if kind.body_type == "jsonb" else body,
        author=row["author"],
        created_at=row["created_at"],
    )


async def latest(db: Db, kind: Kind, name: str) -> Version | None:
    row = await db.fetchrow(
        f"SELECT {_COLUMNS} FROM {kind.table} WHERE name = $1 ORDER BY version DESC LIMIT 1",
        name,
    )
    return None if row is None else _version(kind, row)


async def get(db: Db, kind: Kind, version_id: str) -> Version:
    row = await db.fetchrow(f"SELECT {_COLUMNS} FROM {kind.table} WHERE id = $1", version_id)
    if row is None:
        raise NotFound(f"no version {version_id!r}")
    return _version(kind, row)


async def save(
    db: Db,
    kind: Kind,
    *,
    name: str,
    body: Any,
    base_id: str | None,
    author: str,
) -> Version:
    """A new version of ``name`` on top of ``base_id`` (None only for the first version)."""
    async with transaction(db) as conn:
        current = await latest(conn, kind, name)
        if current is None and base_id is not None:
            raise Conflict(f"{name} has no versions yet; save the first one without a base")
        if current is not None and base_id != current.id:
            based_on = "no base version" if base_id is None else f"version {base_id}"
            raise Conflict(
                f"{name} has changed: the latest is version {current.version} ({current.id}), "
                f"this edit was based on {based_on}; reload it and apply the edit again"
            )
        try:
            # A concurrent save on the same base takes the same version number; the unique
            # (name, version) lets exactly one of them through. A savepoint: the refused one
            # leaves its caller's transaction usable.
            async with conn.transaction():
                row = await conn.fetchrow(
                    f"INSERT INTO {kind.table} (id, name, version, base_id, body, author) "
                    f"VALUES ($1, $2, $3, $4, CAST($5::text AS {kind.body_type}), $6) "
                    f"RETURNING {_COLUMNS}",
                    new_id(kind.prefix),
                    name,
                    1 if current is None else current.version + 1,
                    base_id,
                    json.dumps(body) if kind.body_type == "jsonb" else body,
                    author,
                )
        except asyncpg.UniqueViolationError:
            raise Conflict(
                f"{name} has changed: another edit was saved on the same base; reload it"
            ) from None
    assert row is not None
    return _version(kind, row)
