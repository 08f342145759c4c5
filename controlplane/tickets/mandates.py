"""Mandates: on whose request a ticket's work runs, and its end. The writer of ``mandates``
(forgetting a person aside: :func:`controlplane.people.remove` unlinks them).

A ticket gets its mandate when it is opened (:mod:`.opening`), from the trigger that asked
for it; stopping the ticket for good (by a person, a discarded speculative result, a pull
request closed) revokes it.
"""

from __future__ import annotations

import asyncpg

from controlplane.db.pool import Conn
from superagent_shared.ids import new_id


async def record(
    conn: Conn, ticket_id: str, kind: str, trigger: asyncpg.Record, scope: str
) -> None:
    """The mandate ``trigger`` gives ``ticket_id``: its initiator as the channel verified
    them, the policy that judged the request, and what is and is not to be done."""
    await conn.execute(
        "INSERT INTO mandates (id, ticket_id, kind, initiator_id, initiator_name, "
        "trigger_id, policy_version_id, scope, person_id) "
        "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        new_id("mnd"),
        ticket_id,
        kind,
        trigger["actor_id"],
        trigger["actor_name"],
        trigger["id"],
        trigger["policy_version_id"],
        scope,
        trigger["person_id"],
    )


async def revoke(conn: Conn, ticket_id: str) -> None:
    """The ticket's work no longer runs on anyone's request."""
    await conn.execute(
        "UPDATE mandates SET revoked_at = now() WHERE ticket_id = $1 AND revoked_at IS NULL",
        ticket_id,
    )
