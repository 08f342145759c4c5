"""The Prompts and policies page: every version of each system prompt and of the ingest
policy, newest first, with who saved it and on which version it was based.

Versions are immutable (``controlplane.versions``); ``superagent prompts edit`` and
``superagent admission edit`` save new ones. A name with no saved version runs on its
built-in default, shown as such.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from controlplane.ingest.admission import POLICY_NAME, Admission
from controlplane.prompts import DEFAULTS

PER_NAME = 20

_VERSIONS = """
SELECT name, id, version, base_id, author, created_at, body FROM (
    SELECT v.*, row_number() OVER (PARTITION BY name ORDER BY version DESC) AS n
    FROM {table} v
) ranked WHERE n <= $1 ORDER BY name, version DESC
"""


async def _documents(
    pool: asyncpg.Pool, table: str, defaults: dict[str, Any], edit: str
) -> list[dict[str, Any]]:
    """Each name's latest versions; ``edit`` is the command that saves a new one."""
    rows = await pool.fetch(_VERSIONS.format(table=table), PER_NAME)
    names: dict[str, list[dict[str, Any]]] = {name: [] for name in sorted(defaults)}
    counted = await pool.fetch(f"SELECT name, count(*) AS n FROM {table} GROUP BY name")
    counts = {row["name"]: row["n"] for row in counted}
    for row in rows:
        names.setdefault(row["name"], []).append(dict(row))
    return [
        {
            "name": name,
            "edit": edit.format(name=name),
            "count": counts.get(name, 0),
            "versions": found,
            "default": defaults.get(name) if not found else None,
        }
        for name, found in names.items()
    ]


async def versions(pool: asyncpg.Pool) -> dict[str, Any]:
    return {
        "prompts": await _documents(
            pool, "prompt_versions", dict(DEFAULTS), "superagent prompts edit {name}"
        ),
        "policies": await _documents(
            pool,
            "policy_versions",
            {POLICY_NAME: Admission().model_dump(mode="json")},
            "superagent admission edit",
        ),
    }
