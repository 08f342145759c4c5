"""``ingest()``: store an event as a Trigger on its Thread, judge it, and route it.

One short transaction per event, in this order:

1. The thread is found or created (unique on source + external id).
2. The trigger is inserted unless (source, external id) is already there: a redelivered
   webhook returns the original, untouched.
3. Admission's verdict (:mod:`controlplane.ingest.admission`) and the thread's
   subscribers decide the route:

   * ``subscribers``: the thread has live tickets subscribed, and the event is not noise.
     It goes to each one's inbox (``ticket_inbox``) without a router turn. This adds no
     authority: the tickets' mandates are what they were. (With pass-through off, a
     setting kept for comparison, such events go to the router instead, which forwards
     them.)
   * ``router``: an explicit request, or an inferred candidate the router is to assess.
     It waits in the router's inbox (``routed_at IS NULL``).
   * ``dropped``: nothing to do; the trigger and its verdict stay on record.

4. A NOTIFY wakes whoever it concerns once the transaction commits.

The one writer of ``threads`` (a thread the agent starts itself, for the admin's alerts or
a ticket's pull request, is opened with :func:`open_thread`) and, with :mod:`.routing`
(which moves them on), of ``triggers``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from typing import Any

import asyncpg

from controlplane.db.pool import Conn
from controlplane.domain import CLOSED_TICKET_SQL, EffectKind, Notify
from controlplane.errors import InvalidInput, NotFound, TransientError
from controlplane.ingest import admission
from controlplane.ingest.admission import Actor, Admission, Event
from controlplane.people import Directory
from superagent_shared.ids import new_id

_POLICY_REFRESH_SECONDS = 1.0
_MAX_TEXT = 1_000_000  # characters of an event's text kept on the trigger row


@dataclass(frozen=True)
class ThreadRef:
    external_id: str
    title: str | None = None
    url: str | None = None


@dataclass(frozen=True)
class IncomingTrigger:
    """What a channel adapter hands to ingest, after verifying the event's signature."""

    source: str
    external_id: str  # unique per source: redeliveries carry the same one
    thread: ThreadRef
    actor: Actor
    kind: str
    text: str = ""
    direct: bool = False  # the channel itself addresses the agent (see admission.Event)
    payload: bytes | None = None  # the raw event, kept as a blob
    payload_type: str = "application/json"
    # The channel's id of the message to mark as seen (👀) if this is an explicit request.
    ack_ref: str | None = None
    # Whether it was said in public (a public repository); None when the channel cannot
    # tell, which workers treat as public (workers.hold_untrusted).
    public: bool | None = None


@dataclass(frozen=True)
class Ingested:
    trigger_id: str
    thread_id: str
    duplicate: bool
    verdict: str
    reason: str
    route: str
    tickets: tuple[str, ...] = ()  # the inboxes it went to


class AdmissionSource:
    """The current admission document (``superagent admission``), re-read at most once a second
    (saves apply within 1 s)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self._loaded_at = float("-inf")
        self._current: tuple[str | None, Admission] = (None, Admission())

    async def current(self) -> tuple[str | None, Admission]:
        """(version id or None when never saved, the admission document)."""
        if time.monotonic() - self._loaded_at < _POLICY_REFRESH_SECONDS:
            return self._current
        row = await self.pool.fetchrow(
            "SELECT id, body FROM policy_versions WHERE name = $1 ORDER BY version DESC LIMIT 1",
            admission.POLICY_NAME,
        )
        if row is None:
            self._current = (None, Admission())
        elif row["id"] != self._current[0]:
            self._current = (row["id"], admission.parse(_json(row["body"])))
        self._loaded_at = time.monotonic()
        return self._current

    def forget(self) -> None:
        """Read the document again on next use (after a save in this process)."""
        self._loaded_at = float("-inf")


async def open_thread(
    conn: Conn, source: str, external_id: str, title: str, url: str | None = None
) -> str:
    """The thread ``source:external_id``, made with ``title`` if there is none yet (and its
    ``url`` set when one is given); its id."""
    thread_id = await conn.fetchval(
        "INSERT INTO threads (id, source, external_id, title, url) VALUES ($1, $2, $3, $4, $5) "
        "ON CONFLICT (source, external_id) DO UPDATE SET url = coalesce(EXCLUDED.url, threads.url) "
        "RETURNING id",
        new_id("thr"),
        source,
        external_id,
        title,
        url,
    )
    return str(thread_id)


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _validate(trigger: IncomingTrigger) -> None:
    for field, value, limit in (
        ("source", trigger.source, 50),
        ("external_id", trigger.external_id, 500),
        ("thread.external_id", trigger.thread.external_id, 500),
        ("actor.id", trigger.actor.id, 200),
        ("actor.name", trigger.actor.name, 200),
        ("kind", trigger.kind, 100),
    ):
        if not value or len(value) > limit:
            raise InvalidInput(f"{field} must be 1 to {limit} characters")
    # Postgres text holds neither NUL nor lone surrogates (valid JSON escapes, not UTF-8):
    # refused here, as this event's failure, rather than by the database as a 500.
    optional = (
        ("thread.title", trigger.thread.title),
        ("thread.url", trigger.thread.url),
        ("ack_ref", trigger.ack_ref),
        *(("actor.groups", group) for group in trigger.actor.groups),
    )
    for field, text in (
        ("source", trigger.source),
        ("external_id", trigger.external_id),
        ("thread.external_id", trigger.thread.external_id),
        ("actor.id", trigger.actor.id),
        ("actor.name", trigger.actor.name),
        ("kind", trigger.kind),
        ("text", trigger.text),
        *((field, value) for field, value in optional if value is not None),
    ):
        if not _storable(text):
            raise InvalidInput(f"{field} must be valid Unicode without NUL characters")


def _storable(text: str) -> bool:
    if "\x00" in text:
        return False
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


# Everything in one statement (one round trip, its own transaction):
# * the thread is found or created. Its last_event_at is refreshed at most every 10 s, so
#   that a busy thread's row is not locked by every event;
# * the route follows from admission's verdict (computed before, passed in) and the
#   thread's live subscribers;
# * the trigger is inserted unless (source, external id) exists: a duplicate inserts
#   nothing at all, not even its blob, and returns no row;
# * the blob, the inbox rows and the NOTIFY follow the trigger (foreign keys are checked at
#   the end of the statement; the notification goes out at commit).
# A brand-new thread inserted concurrently by another event is invisible to this
# statement's snapshot: then no row either, and the caller tells that from a duplicate.
_INGEST = f"""
WITH new_thread AS (
    INSERT INTO threads (id, source, external_id, title, url, last_event_at)
    VALUES ($1, $2, $3, $4, $5, now())
    ON CONFLICT (source, external_id) DO NOTHING
    RETURNING id
), thread AS (
    SELECT id FROM new_thread
    UNION ALL
    SELECT id FROM threads WHERE source = $2 AND external_id = $3
    LIMIT 1
), touched AS (
    UPDATE threads th SET last_event_at = now(),
        title = coalesce($4, th.title), url = coalesce($5, th.url)
    FROM thread
    WHERE th.id = thread.id AND NOT EXISTS (SELECT 1 FROM new_thread)
      AND (th.last_event_at IS NULL OR th.last_event_at < now() - interval '10 seconds')
), decided AS (
    SELECT thread.id AS thread_id, coalesce(subs.tickets, '{{}}') AS tickets,
           CASE WHEN subs.tickets IS NOT NULL AND NOT $19::boolean
                     THEN CASE WHEN $24::boolean THEN 'subscribers' ELSE 'router' END
                WHEN $20::boolean THEN 'router'
                ELSE 'dropped' END AS route
    FROM thread LEFT JOIN LATERAL (
        SELECT array_agg(s.ticket_id ORDER BY s.ticket_id) AS tickets
        FROM subscriptions s JOIN tickets k ON k.id = s.ticket_id
        WHERE s.thread_id = thread.id AND k.state NOT IN ({CLOSED_TICKET_SQL})
    ) subs ON true
), t AS (
    INSERT INTO triggers (id, source, external_id, thread_id, actor_id, actor_name,
                          actor_is_bot, kind, text, payload_blob_id, verdict, verdict_reason,
                          policy_version_id, route, routed_at, person_id, allowlisted, public,
                          actor_groups)
    SELECT $6, $2, $7, decided.thread_id, $8, $9, $10, $11, $12, $13, $14, $15, $16,
           decided.route, CASE WHEN decided.route = 'router' THEN NULL ELSE now() END, $23,
           $25, $26, $27
    FROM decided
    ON CONFLICT (source, external_id) DO NOTHING
    RETURNING id, thread_id, route
), b AS (
    INSERT INTO blobs (id, content_type, size, data)
    SELECT $13::text, $17::text, octet_length($18::bytea), $18::bytea
    FROM t WHERE $13::text IS NOT NULL
), inbox AS (
    INSERT INTO ticket_inbox (ticket_id, trigger_id)
    SELECT unnest(decided.tickets), t.id FROM t, decided WHERE t.route = 'subscribers'
), ack AS (
    INSERT INTO effects (id, kind, key, payload, next_attempt_at)
    SELECT $21::text, '{EffectKind.ACKNOWLEDGE}', t.id,
           jsonb_build_object('trigger_id', t.id, 'source', $2::text,
                              'thread_external_id', $3::text, 'message_ref', $22::text),
           now()
    FROM t WHERE $22::text IS NOT NULL
    ON CONFLICT (kind, key) DO NOTHING
    RETURNING pg_notify('{Notify.EFFECTS}', '')
)
SELECT t.id, t.thread_id, t.route, decided.tickets,
       CASE t.route
           WHEN 'subscribers' THEN
               pg_notify('{Notify.INBOX}', t.id || ':' || array_to_string(decided.tickets, ','))
           WHEN 'router' THEN pg_notify('{Notify.ROUTER}', t.id)
       END AS notified
FROM t, decided
"""


class Intake:
    """The one way events enter the system (every channel adapter calls :meth:`ingest`)."""

    def __init__(self, pool: asyncpg.Pool, *, pass_through: bool = True) -> None:
        self.pool = pool
        self.pass_through = pass_through
        self.policy = AdmissionSource(pool)
        self.people = Directory(pool)

    async def ingest(self, trigger: IncomingTrigger) -> Ingested:
        """Store, judge and route ``trigger``; for a redelivered event, the original."""
        _validate(trigger)
        policy_id, policy = await self.policy.current()
        actor = trigger.actor
        person = await self.people.resolve(trigger.source, actor.id)
        if person is not None:
            actor = dataclasses.replace(actor, person=person.name)
        verdict = admission.evaluate(
            policy,
            Event(
                source=trigger.source,
                actor=actor,
                text=trigger.text,
                direct=trigger.direct,
            ),
        )
        for _attempt in range(3):
            row = await self.pool.fetchrow(
                _INGEST,
                new_id("thr"),
                trigger.source,
                trigger.thread.external_id,
                trigger.thread.title,
                trigger.thread.url,
                new_id("trg"),
                trigger.external_id,
                trigger.actor.id,
                trigger.actor.name,
                trigger.actor.is_bot,
                trigger.kind,
                trigger.text[:_MAX_TEXT],
                new_id("blb") if trigger.payload is not None else None,
                verdict.kind,
                verdict.reason,
                policy_id,
                trigger.payload_type,
                trigger.payload,
                verdict.noise,
                verdict.needs_router,
                new_id("eff"),
                trigger.ack_ref if verdict.kind == "explicit" else None,
                person.id if person is not None else None,
                self.pass_through,
                verdict.allowlisted,
                trigger.public,
                # Kept for device authorization (a device may be shared with a group).
                [group[:200] for group in trigger.actor.groups],
            )
            if row is not None:
                return Ingested(
                    trigger_id=row["id"],
                    thread_id=row["thread_id"],
                    duplicate=False,
                    verdict=verdict.kind,
                    reason=verdict.reason,
                    route=row["route"],
                    tickets=tuple(row["tickets"]) if row["route"] == "subscribers" else (),
                )
            try:
                return await self.original(trigger.source, trigger.external_id)
            except NotFound:
                continue  # its thread was new and not yet visible: now it is
        raise TransientError(f"could not record {trigger.source} event {trigger.external_id}")

    async def original(self, source: str, external_id: str) -> Ingested:
        if not _storable(external_id):
            raise NotFound(f"no trigger {external_id[:100]!r} from {source}")  # none can be
        row = await self.pool.fetchrow(
            "SELECT t.id, t.thread_id, t.verdict, t.verdict_reason, t.route, "
            "       array_remove(array_agg(i.ticket_id ORDER BY i.ticket_id), NULL) AS tickets "
            "FROM triggers t LEFT JOIN ticket_inbox i ON i.trigger_id = t.id "
            "WHERE t.source = $1 AND t.external_id = $2 GROUP BY t.id",
            source,
            external_id,
        )
        if row is None:
            raise NotFound(f"no trigger {external_id!r} from {source}")
        return Ingested(
            trigger_id=row["id"],
            thread_id=row["thread_id"],
            duplicate=True,
            verdict=row["verdict"] or "",
            reason=row["verdict_reason"] or "",
            route=row["route"] or "",
            tickets=tuple(row["tickets"]),
        )
