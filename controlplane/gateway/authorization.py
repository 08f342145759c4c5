"""Who may direct work to a device: checked in code wherever work is pointed at one, never
by the model, and once more in the gateway's queue below every entry point.

The device registry's side of the gateway (``devices``, :mod:`.devices`) says which devices
there are; this module says whose they are and who else may use them. It is the writer of
``device_shares``, and of the ``device_approvals`` a check asks for (the owners' answers are
recorded by :mod:`controlplane.tickets.consent`).

A device has an owner (``devices.owner``). Work goes to it only

* for its owner (rule ``owner``);
* for a person or an account the owner shares it with (``delegated``:
  ``superagent devices share DEVICE --with PERSON``);
* for the members of a group it is shared with (``shared``: ``--with group:SOURCE:ID``, or a
  team device paired with ``--shared SOURCE:ID``);
* or per request, with the owner's approval in chat (``approved``,
  :mod:`controlplane.tickets.consent`). The owner directing the work to their device
  themselves (a reroute they ask for) is their approval too.

Who someone is comes only from what the channel verified about their event, as principals:

* their person (``superagent users link``): the person's name, ``alice``;
* their account, ``SOURCE:ID`` with the channel's immutable id (``github:583231``,
  ``slack:T0001/U024BE7LH``); web chat actor ids already read ``web:NAME``;
* each group the channel reported them in: ``group:SOURCE:ID``.

Never a display name or a handle, which others can choose or re-register. Ids compare
exactly, as the channel gives them (:mod:`controlplane.identities`); only the channel's name
in front is case-insensitive, and people's names are lower case.

The admin makes pairing codes (the CLI, the console) and is ``web:admin``, the admin's web
chat identity: a device paired without ``--owner`` is the admin's (so is one with no owner at
all). The CLI and the console act as the admin, so a reroute from them to an admin-owned
device is its owner's own direction.

The check is recorded on the ticket (``tickets.device_grant``, by
:mod:`controlplane.tickets.device_grant`), and the queue repeats it for
each of the ticket's commands (:func:`covered_sql`): a command is queued only on the device
the grant names, and only while what the grant rests on (the owner, a share, an approval)
still holds. Unsharing a device therefore stops the next command of a ticket that relied on
the share.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg

from controlplane import identities
from controlplane.db.pool import Conn, Db
from controlplane.errors import Forbidden, InvalidInput, NotFound
from controlplane.people import check_name
from superagent_shared.ids import new_id

ADMIN = identities.WEB_ADMIN  # the admin: who makes codes in the CLI and the console
HOLD = "device_approval"  # tickets.hold while the device's owner is asked
PENDING = "pending"  # a grant's rule while the owner is asked
RULES = ("owner", "delegated", "shared", "approved")  # what lets work run
_GROUP = "group:"


class DeviceAccessDenied(Forbidden):
    """Work for a requester the device's owner has not let in."""

    code = "device_not_authorized"


# -- principals ----------------------------------------------------------------------------


def account(source: str, actor_id: str) -> str:
    """An account's principal, ``SOURCE:ID`` (web chat ids already carry ``web:``)."""
    return identities.account_text(source.strip().lower(), actor_id.strip())


def group(source: str, name: str) -> str:
    return f"{_GROUP}{source.strip().lower()}:{name.strip()}"


def is_group(principal: str) -> bool:
    return principal.casefold().startswith(_GROUP)


def principals(
    source: str, actor_id: str, person: str | None, groups: list[str] | tuple[str, ...]
) -> frozenset[str]:
    found = {account(source, actor_id)}
    if person:
        found.add(person)
    found.update(group(source, name) for name in groups if name.strip())
    return frozenset(found)


def _source(source: str, written: str) -> str:
    source = source.strip().lower()
    if source not in identities.SOURCES:
        raise InvalidInput(
            f"{written!r}: unknown channel {source!r}; one of: {', '.join(identities.SOURCES)}"
        )
    return source


def _ident(ident: str, written: str) -> str:
    if not ident.strip():
        raise InvalidInput(f"{written!r} names no id after the channel")
    return ident


def parse(written: str, *, groups: bool = True) -> str:
    """An owner or a grantee as written (``alice``, ``github:583231``,
    ``group:slack:S0123``), normalized; InvalidInput saying what is wrong."""
    value = written.strip()
    if not value:
        raise InvalidInput(
            "name a person (superagent users), an account (SOURCE:ID) or a group (group:SOURCE:ID)"
        )
    if len(value) > 200:
        raise InvalidInput("a person, an account or a group is at most 200 characters")
    if is_group(value):
        if not groups:
            raise InvalidInput(
                f"{value!r} is a group; a device's owner is a person or an account (SOURCE:ID)"
            )
        return parse_group(value)
    if ":" in value:
        source, _, ident = value.partition(":")
        principal = account(_source(source, value), _ident(ident, value))
        source, _, ident = principal.partition(":")
        # Ids only: a login or a handle given here would match nobody, or someone else later.
        if not identities.is_id(source, principal if source == "web" else ident):
            raise InvalidInput(
                f"{written!r} is not a {source} account id: give {identities.HOW_TO_GIVE[source]}"
            )
        return principal
    return check_name(value.lower())


def parse_group(written: str) -> str:
    """A team device's group: ``SOURCE:GROUP`` (or ``group:SOURCE:GROUP``)."""
    value = written.strip()
    if is_group(value):
        value = value[len(_GROUP) :]
    source, sep, ident = value.partition(":")
    if not sep:
        raise InvalidInput(
            f"{written!r} is not a group: write SOURCE:GROUP as the channel reports it, "
            "e.g. slack:S0123ABCD or github:acme/devs"
        )
    return group(_source(source, written), _ident(ident, written))


@dataclass(frozen=True)
class Requester:
    """Whom the work is for: what they are matched by, and how to name them to people."""

    # For messages only, never matched: their person, else their display name with the
    # verified account beside it (an owner asked to approve sees who really asks).
    name: str
    principals: frozenset[str]
    handle: str  # how `superagent devices share --with` names them: person, else account
    trigger_id: str | None = None
    thread_id: str | None = None


_TRIGGER = (
    "SELECT g.id, g.source, g.actor_id, g.actor_name, g.actor_groups, g.thread_id, "
    "p.name AS person FROM triggers g LEFT JOIN people p ON p.id = g.person_id"
)


def _requester(row: asyncpg.Record) -> Requester:
    own = account(row["source"], row["actor_id"])
    shown = row["actor_name"] if row["actor_name"] != own else None
    return Requester(
        name=row["person"] or (f"{shown} ({own})" if shown else own),
        principals=principals(
            row["source"], row["actor_id"], row["person"], list(row["actor_groups"] or ())
        ),
        handle=row["person"] or own,
        trigger_id=row["id"],
        thread_id=row["thread_id"],
    )


async def requester_of_trigger(db: Db, trigger_id: str) -> Requester:
    """Who sent a trigger, as its channel verified them."""
    row = await db.fetchrow(f"{_TRIGGER} WHERE g.id = $1", trigger_id)
    if row is None:
        raise NotFound(f"no trigger {trigger_id}")
    return _requester(row)


async def requester_of_ticket(db: Db, ticket_id: str) -> Requester:
    """Whom a ticket's work is for: the initiator of its first mandate."""
    row = await db.fetchrow(
        "SELECT m.trigger_id, m.initiator_name, p.name AS person FROM mandates m "
        "LEFT JOIN people p ON p.id = m.person_id WHERE m.ticket_id = $1 "
        "ORDER BY m.created_at LIMIT 1",
        ticket_id,
    )
    if row is None:
        return Requester("nobody", frozenset(), "nobody")  # no mandate: only approvals
    if row["trigger_id"] is not None:
        return await requester_of_trigger(db, row["trigger_id"])
    # A mandate without its trigger: only its person is known for sure.
    person = row["person"]
    return Requester(
        name=person or row["initiator_name"],
        principals=frozenset({person}) if person else frozenset(),
        handle=person or row["initiator_name"],
    )


# -- devices and the check -----------------------------------------------------------------


@dataclass(frozen=True)
class Device:
    id: str
    name: str
    owner: str  # a device paired with no owner at all is the admin's
    shares: tuple[str, ...]


_DEVICE = (
    "SELECT d.id, d.name, coalesce(nullif(d.owner, ''), $2) AS owner, "
    "coalesce((SELECT array_agg(s.grantee ORDER BY s.grantee) FROM device_shares s "
    "          WHERE s.device_id = d.id), '{}') AS shares "
    "FROM devices d WHERE (d.id = $1 OR d.name = $1) AND d.revoked_at IS NULL"
)


async def device(db: Db, name_or_id: str) -> Device:
    """An active device with its owner and shares; NotFound when there is none."""
    row = await db.fetchrow(_DEVICE, name_or_id, ADMIN)
    if row is None:
        raise NotFound(f"no paired device {name_or_id!r}")
    return Device(row["id"], row["name"], row["owner"], tuple(row["shares"]))


def check(
    device: Device,
    requester: Requester,
    *,
    by: str,
    director: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """The grant for ``requester``'s work on ``device``, as recorded on a ticket: its rule
    (owner, delegated, shared, approved; ``pending`` when the owner must be asked), what
    matched, by whom it was checked (``by``), when. ``director`` is whoever points the work
    at the device when that is not the requester (a reroute): the owner doing so approves."""
    grant: dict[str, Any] = {
        "device_id": device.id,
        "device": device.name,
        "owner": device.owner,
        "requester": requester.name,
        "principals": sorted(requester.principals),
        "by": by,
        "at": datetime.now(UTC).isoformat(),
    }
    owner = device.owner
    if owner in requester.principals:
        return grant | {"rule": "owner", "matched": device.owner}
    # A share to the person or the account before one to a group: the more specific.
    for grantee in sorted(device.shares, key=lambda g: (is_group(g), g)):
        if grantee in requester.principals:
            rule = "shared" if is_group(grantee) else "delegated"
            return grant | {"rule": rule, "matched": grantee}
    if owner in director:
        return grant | {"rule": "approved", "matched": device.owner, "how": "by its owner"}
    return grant | {"rule": PENDING}


def covers(grant: dict[str, Any] | None) -> bool:
    return grant is not None and grant.get("rule") in RULES


async def ask(
    conn: Conn,
    grant: dict[str, Any],
    requester: Requester,
    *,
    what: str,
    ticket_id: str | None = None,
    run: dict[str, Any] | None = None,
    resume: str | None = None,
    thread_id: str | None = None,
) -> str:
    """Record an approval for ``grant`` (the owner is asked by
    :mod:`controlplane.tickets.consent`), or, for
    one the owner gave by directing the work themselves, record it as given. Its id."""
    approval_id = new_id("apr")
    given = grant["rule"] == "approved"
    await conn.execute(
        "INSERT INTO device_approvals (id, device_id, ticket_id, trigger_id, thread_id, owner, "
        "requester, principals, what, run, resume, state, decided_at, decided_by) "
        "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::text::jsonb, $11, $12, "
        "        CASE WHEN $13 THEN now() END, $14)",
        approval_id,
        grant["device_id"],
        ticket_id,
        requester.trigger_id,
        thread_id or requester.thread_id,
        grant["owner"],
        requester.name[:200],
        sorted(requester.principals),
        what,
        None if run is None else dumps(run),
        resume,
        "approved" if given else "pending",
        given,
        f"{grant['matched']} ({grant['by']})"[:200] if given else None,
    )
    return approval_id


async def cancel_pending(conn: Conn, ticket_id: str, *, by: str) -> None:
    """The ticket no longer waits for these owners (it moved, or stopped)."""
    await conn.execute(
        "UPDATE device_approvals SET state = 'cancelled', decided_at = now(), decided_by = $2 "
        "WHERE ticket_id = $1 AND state = 'pending'",
        ticket_id,
        by[:200],
    )


async def owned(db: Db, requester: Requester) -> list[tuple[str, str]]:
    """(id, lowercased name and labels) of the active devices ``requester`` owns."""
    rows = await db.fetch(
        "SELECT d.id, lower(d.name || ' ' || d.labels::text) AS about FROM devices d "
        "WHERE d.revoked_at IS NULL AND coalesce(nullif(d.owner, ''), $2) = ANY($1) "
        "ORDER BY d.last_seen_at DESC NULLS LAST, d.name",
        sorted(requester.principals),
        ADMIN,
    )
    return [(row["id"], row["about"]) for row in rows]


def covered_sql(device: str, ticket: str) -> str:
    """A SQL condition: ticket ``ticket``'s grant covers device ``device`` now (both are SQL
    expressions). The gateway's queue puts it in the statement that queues a command, so
    no path that forgot the check can queue one."""
    return f"""EXISTS (
    SELECT 1 FROM tickets gt
    WHERE gt.id = {ticket} AND gt.device_grant->>'device_id' = {device}
      AND CASE
          WHEN gt.device_grant->>'rule' = 'approved' THEN EXISTS (
              SELECT 1 FROM device_approvals ga
              WHERE ga.id = gt.device_grant->>'approval' AND ga.state = 'approved'
                AND ga.ticket_id = gt.id AND ga.device_id = {device})
          WHEN gt.device_grant->>'rule' IN ('owner', 'delegated', 'shared') THEN EXISTS (
              SELECT 1 FROM devices gd,
                   jsonb_array_elements_text(gt.device_grant->'principals') AS who(principal)
              WHERE gd.id = {device}
                AND (coalesce(nullif(gd.owner, ''), '{ADMIN}') = who.principal
                     OR EXISTS (SELECT 1 FROM device_shares gs WHERE gs.device_id = gd.id
                                AND gs.grantee = who.principal)))
          ELSE false
      END)"""


async def refusal(db: Db, device: str, ticket_id: str) -> DeviceAccessDenied:
    """Why a ticket's command was not queued on a device that exists."""
    grant = loads(await db.fetchval("SELECT device_grant FROM tickets WHERE id = $1", ticket_id))
    if grant is not None and grant.get("rule") == PENDING:
        why = f"it waits for {grant.get('owner')}'s approval ({grant.get('approval')})"
    elif grant is None or grant.get("device_id") != device:
        why = "its requester was never checked for this device"
    else:
        why = f"what let it in ({grant.get('rule')}: {grant.get('matched')}) no longer holds"
    return DeviceAccessDenied(f"{ticket_id} is not authorized to use the device {device}: {why}")


# -- shares --------------------------------------------------------------------------------


async def share(pool: asyncpg.Pool, name_or_id: str, grantee: str, *, by: str) -> Device:
    """Let ``grantee`` (a person, an account or a group) direct work to the device."""
    principal = parse(grantee)
    async with pool.acquire() as conn, conn.transaction():
        found = await device(conn, name_or_id)
        await add_share(conn, found.id, principal, by=by)
        return await device(conn, found.id)


async def add_share(conn: Conn, device_id: str, principal: str, *, by: str) -> None:
    """``principal`` (already parsed) may direct work to the device; a second time changes
    nothing. Also how a team device's group gets its share when it is paired."""
    await conn.execute(
        "INSERT INTO device_shares (device_id, grantee, created_by) VALUES ($1, $2, $3) "
        "ON CONFLICT DO NOTHING",
        device_id,
        principal,
        by,
    )


async def unshare(pool: asyncpg.Pool, name_or_id: str, grantee: str) -> Device:
    """Take a share back; the next command of a ticket that relied on it is refused."""
    principal = parse(grantee)
    async with pool.acquire() as conn, conn.transaction():
        found = await device(conn, name_or_id)
        gone = await conn.fetchval(
            "DELETE FROM device_shares WHERE device_id = $1 AND grantee = $2 RETURNING grantee",
            found.id,
            principal,
        )
        if gone is None:
            raise NotFound(f"{found.name} is not shared with {principal}")
        return await device(conn, found.id)


def dumps(value: dict[str, Any]) -> str:
    return json.dumps(value, default=str)


def loads(value: object) -> dict[str, Any] | None:
    """A grant (or an approval's command) as read back: a dict with the pool's JSON codec,
    else text."""
    if isinstance(value, str):
        value = json.loads(value)
    return value if isinstance(value, dict) else None
