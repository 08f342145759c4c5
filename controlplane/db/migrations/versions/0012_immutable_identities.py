"""access: people matched by immutable account ids

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01 20:00:00.000000

Allowlists and account links used to match an actor's id *or name*. From here on they match
the channel's immutable id only (controlplane.identities). This migration:

* adds ``accounts.label`` (the handle an account was linked by, for display);
* gives stored triggers and mandates the new actor ids where they changed: the web chat's
  one principal ``web:admin`` (every holder of the admin token), and Slack's ``TEAM/USER``
  (the team read from each trigger's own stored payload);
* converts linked accounts given by handle (a GitHub login, a bare Slack user id, a
  casefolded id) to ids, using the triggers already stored: a handle seen with exactly one
  id becomes that id. Names typed in the web chat and Lark display names are never
  converted: their owners choose them;
* writes a new version of the ingest policy with its entries converted the same way, the
  handle kept in ``labels``.

What cannot be converted (never seen, seen with several ids, a chosen name) is logged and
made inert rather than left to match names: an account's handle becomes
``unresolved:<handle>``, which no actor id can equal; a policy entry moves to the policy's
``unresolved`` list. Link or allowlist them again by id (or by a handle, which is then
resolved through the channel's API).

Self-contained on purpose: it must keep doing what it did when later code changes.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.engine import Connection

from superagent_shared.ids import new_id

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

log = logging.getLogger("controlplane.db.migrations.0012")

WEB_ADMIN = "web:admin"
UNRESOLVED = "unresolved:"
AUTHOR = "migration 0012 (immutable ids)"
_BATCH = 1000
# The id shapes of controlplane.identities, as of this revision.
_IDS = {
    "github": re.compile(r"^[1-9][0-9]{0,19}$"),
    "slack": re.compile(r"^[TE][A-Z0-9]{2,30}/[UWB][A-Z0-9]{2,30}$"),
    "lark": re.compile(r"^ou_[0-9a-z]{6,64}$"),
    "matrix": re.compile(r"^@[^\s:]{1,255}:[A-Za-z0-9.\-\[\]:]{1,255}$"),
    "web": re.compile(r"^web:[a-z0-9][a-z0-9._-]{0,63}$"),
}
_SLACK_TEAM = re.compile(r"^[TE][A-Z0-9]{2,30}$")
_SLACK_USER = re.compile(r"^[UWB][A-Z0-9]{2,30}$")
# Where a name was never an identity: converting it by the triggers seen would pick
# whoever chose it.
_CHOSEN_NAMES = frozenset({"lark", "web"})


def _is_id(source: str | None, text: str) -> bool:
    if source is None:
        return any(form.match(text) for form in _IDS.values())
    form = _IDS.get(source)
    return form is not None and form.match(text) is not None


# ------------------------------------------------------------------ triggers and mandates


def _team_of(data: bytes | None) -> str | None:
    """The author's workspace in a stored Slack event_callback, as Slack sent it."""
    if not data:
        return None
    try:
        callback = json.loads(bytes(data))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(callback, dict):
        return None
    event = callback.get("event")
    event = event if isinstance(event, dict) else {}
    grants = callback.get("authorizations")
    grants = grants if isinstance(grants, list) and grants else [{}]
    for team in (
        event.get("user_team"),
        event.get("team"),
        callback.get("team_id"),
        grants[0].get("team_id") if isinstance(grants[0], dict) else None,
    ):
        if isinstance(team, str) and _SLACK_TEAM.match(team):
            return team
    return None


def _qualify_slack_triggers(conn: Connection) -> None:
    after, changed, unknown = "", 0, 0
    while True:
        rows = conn.execute(
            sa.text(
                "SELECT t.id, t.actor_id, b.data FROM triggers t "
                "LEFT JOIN blobs b ON b.id = t.payload_blob_id "
                "WHERE t.source = 'slack' AND t.actor_id NOT LIKE '%/%' AND t.id > :after "
                "ORDER BY t.id LIMIT :n"
            ),
            {"after": after, "n": _BATCH},
        ).all()
        if not rows:
            break
        after = rows[-1].id
        updates = []
        for row in rows:
            team = _team_of(row.data)
            if team is None or not _SLACK_USER.match(row.actor_id):
                unknown += 1
                continue
            updates.append({"id": row.id, "actor": f"{team}/{row.actor_id}"})
        if updates:
            conn.execute(sa.text("UPDATE triggers SET actor_id = :actor WHERE id = :id"), updates)
            changed += len(updates)
    conn.execute(
        sa.text(
            "UPDATE mandates m SET initiator_id = t.actor_id FROM triggers t "
            "WHERE m.trigger_id = t.id AND t.source = 'slack' "
            "AND m.initiator_id NOT LIKE '%/%' AND t.actor_id LIKE '%/%'"
        )
    )
    if changed or unknown:
        log.warning(
            "0012: %d Slack triggers now name their author as TEAM/USER; %d name no team "
            "in their stored payload and keep their old actor id",
            changed,
            unknown,
        )


def _web_is_one_principal(conn: Connection) -> None:
    conn.execute(
        sa.text(
            "UPDATE triggers SET actor_id = :admin WHERE source = 'web' AND actor_id <> :admin"
        ),
        {"admin": WEB_ADMIN},
    )
    conn.execute(
        sa.text(
            "UPDATE mandates SET initiator_id = :admin "
            "WHERE initiator_id LIKE 'web:%' AND initiator_id <> :admin"
        ),
        {"admin": WEB_ADMIN},
    )


# ------------------------------------------------------------------ the directory seen


def _seen(conn: Connection, source: str | None, handle: str) -> list[tuple[str, str]]:
    """(source, id) of the actors stored triggers show ``handle`` as: by name, or by an id
    that equals it but for case (the old links were casefolded). Ids only."""
    # A bare Slack user id (what the old actor ids were) is found under its team now.
    slack_user = _SLACK_USER.match(handle.upper()) is not None
    rows = conn.execute(
        sa.text(
            "SELECT DISTINCT source, actor_id FROM triggers "
            "WHERE (CAST(:source AS text) IS NULL OR source = :source) "
            "AND (lower(actor_name) = lower(:handle) OR lower(actor_id) = lower(:handle) "
            "     OR (:slack_user AND source = 'slack' "
            "         AND split_part(actor_id, '/', 2) = upper(:handle))) "
            "ORDER BY source, actor_id LIMIT 20"
        ),
        {"source": source, "handle": handle, "slack_user": slack_user},
    ).all()
    found = [(row.source, row.actor_id) for row in rows if _is_id(row.source, row.actor_id)]
    # A name someone chose (a Lark display name, a web chat name) is no evidence; an id
    # recovered from its casefolded form is.
    return [
        (src, ident)
        for src, ident in found
        if src not in _CHOSEN_NAMES or ident.lower() == handle.lower()
    ]


# ------------------------------------------------------------------ accounts


def _account_id(conn: Connection, source: str, handle: str) -> tuple[str | None, str]:
    """(the id ``handle`` converts to, or None; why, when None)."""
    if source == "web":
        if handle in ("admin", WEB_ADMIN):
            return WEB_ADMIN, ""
        return None, "a name typed in the web chat is not an identity (the chat has one: web:admin)"
    if source == "github" and _is_id("github", handle):
        return handle, ""
    if source == "slack" and _is_id("slack", handle.upper()):
        return handle.upper(), ""
    seen = [ident for src, ident in _seen(conn, source, handle) if src == source]
    if len(seen) == 1:
        return seen[0], ""
    if source in ("matrix", "lark") and _is_id(source, handle):
        return handle, ""  # an id already (its case could not be checked against triggers)
    if not seen:
        if source == "lark":
            return None, "a Lark display name is not an identity; link the open_id"
        return None, "no stored trigger shows it"
    return None, f"stored triggers show it as several accounts ({', '.join(seen)})"


def _convert_accounts(conn: Connection) -> None:
    rows = conn.execute(
        sa.text(
            "SELECT source, handle, person_id, (SELECT name FROM people WHERE id = person_id) "
            "AS person FROM accounts WHERE handle NOT LIKE :inert ORDER BY source, handle"
        ),
        {"inert": f"{UNRESOLVED}%"},
    ).all()
    for row in rows:
        new, why = _account_id(conn, row.source, row.handle)
        if new == row.handle:
            continue
        if new is not None:
            owner = conn.execute(
                sa.text("SELECT person_id FROM accounts WHERE source = :s AND handle = :h"),
                {"s": row.source, "h": new},
            ).scalar()
            if owner is None:
                conn.execute(
                    sa.text(
                        "UPDATE accounts SET handle = :new, label = :label "
                        "WHERE source = :s AND handle = :h"
                    ),
                    {"new": new, "label": row.handle, "s": row.source, "h": row.handle},
                )
                log.warning(
                    "0012: %s's account %s:%s is now %s:%s",
                    row.person,
                    row.source,
                    row.handle,
                    row.source,
                    new,
                )
                continue
            if owner == row.person_id:  # linked by both its handle and its id: one link
                conn.execute(
                    sa.text("DELETE FROM accounts WHERE source = :s AND handle = :h"),
                    {"s": row.source, "h": row.handle},
                )
                continue
            why = f"its id {new} is linked to someone else"
        conn.execute(
            sa.text(
                "UPDATE accounts SET handle = :inert, label = :label "
                "WHERE source = :s AND handle = :h"
            ),
            {
                "inert": (UNRESOLVED + row.handle)[:200],
                "label": row.handle,
                "s": row.source,
                "h": row.handle,
            },
        )
        log.warning(
            "0012: NOT converted: %s's account %s:%s (%s); it now matches nobody: link the "
            "account again by its id, e.g. `superagent users link %s %s:ID`",
            row.person,
            row.source,
            row.handle,
            why,
            row.person,
            row.source,
        )


# ------------------------------------------------------------------ the policy


def _policy_lists(body: dict[str, Any]) -> list[tuple[str, str | None, bool, list[str]]]:
    """(where, the channel its actors come from or None, person names count, entries)."""
    lists: list[tuple[str, str | None, bool, list[str]]] = [
        ("agent_ids", None, False, list(body.get("agent_ids") or []))
    ]
    default = body.get("default") or {}
    for key in ("users", "bots"):
        lists.append((f"default.{key}", None, key == "users", list(default.get(key) or [])))
    for name, source in (body.get("sources") or {}).items():
        for key in ("users", "bots"):
            lists.append(
                (f"sources.{name}.{key}", name, key == "users", list(source.get(key) or []))
            )
    return lists


def _put(body: dict[str, Any], where: str, entries: list[str]) -> None:
    parts = where.split(".")
    if parts == ["agent_ids"]:
        body["agent_ids"] = entries
    elif parts[0] == "default":
        body.setdefault("default", {})[parts[1]] = entries
    else:
        body["sources"][parts[1]][parts[2]] = entries


def _convert_entry(
    conn: Connection, source: str | None, people: bool, persons: set[str], entry: str
) -> tuple[list[str], str | None, str]:
    """(what the entry becomes, the label of a converted id, why not when nothing)."""
    if _is_id(source, entry) and not (source == "web" and entry != WEB_ADMIN):
        return [entry], None, ""
    if source == "slack" and _is_id("slack", entry.upper()):
        return [entry.upper()], None, ""
    kept = [entry] if people and entry.casefold() in persons else []
    if source in _CHOSEN_NAMES:
        why = "a chosen name is not an identity"
        return kept, None, why
    seen = _seen(conn, source, entry)
    seen = [(src, ident) for src, ident in seen if src not in _CHOSEN_NAMES]
    if len(seen) == 1:
        src, ident = seen[0]
        return [ident, *kept], f"{src}:{entry}", ""
    if kept:
        return kept, None, ""
    if not seen:
        return [], None, "no stored trigger shows it"
    return [], None, f"stored triggers show it as several accounts: {seen}"


def _convert_policy(conn: Connection) -> None:
    row = conn.execute(
        sa.text(
            "SELECT id, version, body FROM policy_versions WHERE name = 'ingest' "
            "ORDER BY version DESC LIMIT 1"
        )
    ).first()
    if row is None:
        return
    old = json.loads(row.body) if isinstance(row.body, str) else dict(row.body)
    body = json.loads(json.dumps(old))
    persons = {
        str(name).casefold() for name in conn.execute(sa.text("SELECT name FROM people")).scalars()
    }
    labels: dict[str, str] = dict(body.get("labels") or {})
    unresolved: list[str] = list(body.get("unresolved") or [])
    changed = False
    for where, source, people, entries in _policy_lists(body):
        converted: list[str] = []
        for entry in entries:
            values, label, why = _convert_entry(conn, source, people, persons, str(entry))
            changed = changed or values != [entry]
            if not values:
                unresolved.append(f"{where}: {entry}")
                log.warning(
                    "0012: NOT converted: policy entry %s: %r (%s); it is set aside in the "
                    "policy's unresolved list and matches nobody: add it again by id, or as "
                    "SOURCE:HANDLE with `superagent policy edit`",
                    where,
                    entry,
                    why,
                )
            for value in values:
                if value not in converted:
                    converted.append(value)
                if label is not None and value != entry:
                    labels[value] = label
                    log.warning("0012: policy entry %s: %r is now %r", where, entry, value)
        _put(body, where, converted)
    if not changed:
        return
    body["labels"] = labels
    body["unresolved"] = unresolved
    _new_policy_version(conn, row.id, row.version, body)


def _new_policy_version(conn: Connection, base_id: str, version: int, body: Any) -> None:
    conn.execute(
        sa.text(
            "INSERT INTO policy_versions (id, name, version, base_id, body, author) "
            "VALUES (:id, 'ingest', :version, :base, CAST(:body AS jsonb), :author)"
        ),
        {
            "id": new_id("pol"),
            "version": version + 1,
            "base": base_id,
            "body": json.dumps(body),
            "author": AUTHOR,
        },
    )


# ------------------------------------------------------------------ upgrade / downgrade


def upgrade() -> None:
    op.add_column("accounts", sa.Column("label", sa.String(length=200), nullable=True))
    conn = op.get_bind()
    _web_is_one_principal(conn)
    _qualify_slack_triggers(conn)
    _convert_accounts(conn)
    _convert_policy(conn)


def downgrade() -> None:
    """Back to matching ids or names. Ids stay ids (the old code matched ids too), except
    where the old code's ids differ: Slack loses its team, web chat users get their names
    back as ids, inert links get their handles back, and the policy drops what the old
    code does not know (``labels``, ``unresolved``: its entries go back to their lists)."""
    conn = op.get_bind()
    conn.execute(
        sa.text(
            "UPDATE triggers SET actor_id = 'web:' || actor_name "
            "WHERE source = 'web' AND actor_id = :admin"
        ),
        {"admin": WEB_ADMIN},
    )
    conn.execute(
        sa.text(
            "UPDATE mandates SET initiator_id = 'web:' || initiator_name "
            "WHERE initiator_id = :admin"
        ),
        {"admin": WEB_ADMIN},
    )
    conn.execute(
        sa.text(
            "UPDATE triggers SET actor_id = split_part(actor_id, '/', 2) "
            "WHERE source = 'slack' AND actor_id ~ '^[TE][A-Z0-9]+/[UWB][A-Z0-9]+$'"
        )
    )
    conn.execute(
        sa.text(
            "UPDATE mandates SET initiator_id = split_part(initiator_id, '/', 2) "
            "WHERE initiator_id ~ '^[TE][A-Z0-9]+/[UWB][A-Z0-9]+$'"
        )
    )
    # The old links were casefolded handles; a collision keeps the first.
    for row in conn.execute(sa.text("SELECT source, handle FROM accounts")).all():
        old = row.handle.removeprefix(UNRESOLVED)
        if row.source == "slack" and _is_id("slack", old):
            old = old.split("/", 1)[1]
        old = old.casefold()
        if old != row.handle:
            conn.execute(
                sa.text(
                    "UPDATE accounts SET handle = :old WHERE source = :s AND handle = :h "
                    "AND NOT EXISTS (SELECT 1 FROM accounts WHERE source = :s AND handle = :old)"
                ),
                {"old": old, "s": row.source, "h": row.handle},
            )
    op.drop_column("accounts", "label")
    latest = conn.execute(
        sa.text(
            "SELECT id, version, body FROM policy_versions WHERE name = 'ingest' "
            "ORDER BY version DESC LIMIT 1"
        )
    ).first()
    if latest is None:
        return
    body = json.loads(latest.body) if isinstance(latest.body, str) else dict(latest.body)
    if "labels" not in body and "unresolved" not in body:
        return
    body.pop("labels", None)
    for item in body.pop("unresolved", None) or []:
        where, _, entry = str(item).partition(": ")
        lists = {w: entries for w, _s, _p, entries in _policy_lists(body)}
        if where in lists:
            _put(body, where, [*lists[where], entry])
    for where, source, _people, entries in _policy_lists(body):
        if source in (None, "slack"):
            _put(
                body,
                where,
                [e.split("/", 1)[1] if _is_id("slack", e) else e for e in entries],
            )
    _new_policy_version(conn, latest.id, latest.version, body)
