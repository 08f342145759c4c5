"""The worker pool of one replica: starts rounds, renews their leases, takes over orphans.

Every replica runs one, a Service on the shared loop
(:func:`controlplane.services.critical_loop`). Each pass (woken by NOTIFY, at least every second):

1. renews the leases of the rounds it runs, and stops any it lost;
2. housekeeping, idempotent on every replica: a ticket whose pull request was merged is
   completed, one whose pull request was closed without a merge is stopped; device waits
   past their expiry ask people whether to reroute or drop, and their answer
   (``reroute <device>`` / ``drop``) is carried out;
3. takes over rounds whose lease expired (their replica died), then starts rounds for
   tickets that need one: new tickets, tickets whose device came back, tickets that wait
   for people and got an event that wakes them, and tickets in ``ready`` whose pull request
   called for one.

Which events wake a waiting ticket:

* in ``ready`` (its pull request open; :mod:`controlplane.tickets.pr_rounds`): a person's
  event (a review, a review comment, a comment); a failed CI result, up to
  ``workers.ci_fix_rounds_limit`` automatic fix rounds, after which the next failure ends it
  ``blocked`` naming the check; bot events, up to ``workers.bot_rounds_limit`` rounds in a
  row, after which they wait (hold ``bot loop``). A person's event starts both counts over.
  A CI result that passed and a push notice wake nothing. The woken round is the same
  ticket, session and branch: it pushes to the same pull request and answers review
  comments in their threads;
* after a question, blocked or failed: only a person (a human message, a retry), while CI
  and bot events are recorded for the worker to read when it wakes (a CI result is CI's,
  whoever sent it); a round started so starts the counts above over;
* an action held for confirmation (:mod:`controlplane.tickets.authority`): only an
  allowlisted person or a retry.
"""

from __future__ import annotations

import asyncio
import logging
import re
from datetime import timedelta

import asyncpg
import openai

from controlplane.db import outage
from controlplane.db.listen import listen
from controlplane.domain import Notify, TicketState
from controlplane.errors import SuperagentError
from controlplane.gateway import authorization as access
from controlplane.gateway.devices import ONLINE_WINDOW
from controlplane.gateway.queue import CommandQueue
from controlplane.ingest import inbox
from controlplane.ingest.inbox import IS_STOP
from controlplane.replies import enqueue_reply
from controlplane.services import Service, critical_loop, is_transient_or_database
from controlplane.settings import Settings
from controlplane.tickets import control, pr_rounds, reports, retries, slots, store
from controlplane.tickets.authority import HOLD
from controlplane.workers import workspace
from controlplane.workers.worker import RoundOver, Worker
from superagent_shared.ids import stable_id

log = logging.getLogger(__name__)

POLL_SECONDS = 1.0

# Tickets that need a round, and why; human-woken ones may use the extra slot. Tickets in
# ready are pr_rounds' (pending).
_WAKE = f"""
SELECT t.id, t.state, CASE WHEN t.hold = 'retrying' THEN 'retry' ELSE 'new' END AS why,
       false AS human
FROM tickets t WHERE t.state = 'open' AND (t.retry_at IS NULL OR t.retry_at <= now())
UNION ALL
SELECT t.id, t.state, 'device', false FROM tickets t JOIN devices d ON d.id = t.device_id
WHERE t.state = 'waiting_device' AND d.revoked_at IS NULL
  AND d.connected_replica IS NOT NULL AND d.last_seen_at > now() - $1::interval
UNION ALL
SELECT t.id, t.state, CASE WHEN coalesce(h.human, false) THEN 'human' ELSE 'event' END,
       coalesce(h.human, false)
FROM tickets t
LEFT JOIN LATERAL (
    -- a person: not a bot, not CI output (whoever sent it), not a push notice
    SELECT bool_or({pr_rounds.PERSON}) AS human,
           bool_or(g.allowlisted AND {pr_rounds.PERSON}) AS heard
    FROM ticket_inbox i JOIN triggers g ON g.id = i.trigger_id
    JOIN threads th ON th.id = g.thread_id
    WHERE i.ticket_id = t.id AND i.read_at IS NULL AND i.handed_back_at IS NULL
      AND NOT {IS_STOP}
      -- the merge or close of the ticket's own PR ends it (tickets.store), no worker
      AND NOT (g.kind = 'pull_request.closed' AND th.url IS NOT DISTINCT FROM t.pr_url)
) h ON true
-- a ticket waiting for its device's owner to approve wakes only by their answer
WHERE t.state = 'waiting_human'
  AND coalesce(t.hold, '') NOT IN ('device_expired', '{access.HOLD}')
  -- a held action waits for someone with authority: a stranger cannot wake it
  AND (coalesce(CASE WHEN t.hold = '{HOLD}' THEN h.heard ELSE h.human END, false)
       OR EXISTS (SELECT 1 FROM worker_events w
                  WHERE w.ticket_id = t.id AND w.read_at IS NULL AND w.kind = 'retry'))
LIMIT 100
"""

_REROUTE = re.compile(r"\breroute\b(?:\s+(?:to\s+)?([\w.\-]+))?", re.IGNORECASE)
_DROP = re.compile(r"\b(drop|stop|cancel)\b", re.IGNORECASE)


class WorkerService(Service):
    name = "workers"

    def __init__(
        self,
        pool: asyncpg.Pool,
        queue: CommandQueue,
        client: openai.AsyncOpenAI,
        settings: Settings,
        *,
        owner: str,
        dsn: str,
    ) -> None:
        super().__init__()
        self.pool = pool
        self.queue = queue
        self.client = client
        self.settings = settings
        self.limits = settings.workers
        self.owner = owner
        self.dsn = dsn
        self.lease = timedelta(seconds=self.limits.lease_seconds)
        self.rounds: dict[str, asyncio.Task[None]] = {}
        self._listener = listen(dsn, Notify.WORKERS, Notify.INBOX, name=self.name)
        self._wake = self._listener.wake  # also set when a round ends
        self._renewed_at = 0.0

    async def run(self) -> None:
        await self._listener.start()
        try:
            # A pass that fails on the database (gone, or a statement failing) is retried
            # after a backoff of at most a poll, as a pass renews the rounds' leases; a bug
            # outside the database ends the service loudly. A round's own failure never
            # reaches here: it is its ticket's (:meth:`_failed`).
            await critical_loop(
                self.name,
                self._pass,
                self.stopping,
                backoff_cap=POLL_SECONDS,
                retry=is_transient_or_database,
            )
        finally:
            await self._shutdown()
            await self._listener.close()

    async def _pass(self) -> None:
        """One pass (see the module), then its wait for a notification or the poll."""
        self._wake.clear()
        loop = asyncio.get_running_loop()
        if loop.time() - self._renewed_at >= self.limits.renew_seconds:
            await self._renew()
            self._renewed_at = loop.time()
        await self._housekeeping()
        await self._claim()
        await self._listener.wait(POLL_SECONDS, unless=self.stopping)

    async def _shutdown(self) -> None:
        tasks = list(self.rounds.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        try:
            # Given up now, not at lease end: another replica resumes them at once.
            await slots.release(self.pool, self.owner, list(self.rounds))
        except outage.DATABASE_ERRORS as exc:
            log.warning("workers: could not release leases (%s); they expire", exc)
        self.rounds.clear()

    # -- leases --------------------------------------------------------------------------

    async def _renew(self) -> None:
        held = await slots.renew(self.pool, self.owner, list(self.rounds), self.lease)
        for assignment_id, task in list(self.rounds.items()):
            if assignment_id not in held:
                log.info("workers: %s is no longer ours; stopping it here", assignment_id)
                task.cancel()

    def _launch(self, assignment: slots.Assignment) -> None:
        worker = Worker(self.pool, self.queue, self.client, self.settings, assignment)

        async def run() -> None:
            try:
                outcome = await worker.run()
                log.info("workers: %s ended: %s", assignment.id, outcome)
            except RoundOver as over:
                log.info("workers: %s", over)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                await self._failed(assignment, exc)
            finally:
                self.rounds.pop(assignment.id, None)
                self._wake.set()

        self.rounds[assignment.id] = asyncio.create_task(run(), name=f"worker {assignment.id}")

    async def _failed(self, assignment: slots.Assignment, exc: Exception) -> None:
        """A round's failure is its ticket's (retried with backoff, then blocked), never the
        service's. Only when the database itself is away is the lease left to expire: the
        round is taken over once it is back."""
        if outage.database_trouble(exc):
            if not await outage.absorbed(exc, "workers"):
                log.warning(
                    "workers: round %s of %s lost its database (%s); it resumes when its "
                    "lease ends",
                    assignment.id,
                    assignment.ticket_id,
                    exc,
                )
            return
        try:
            await retries.round_failed(self.pool, self.settings, assignment, exc)
        except Exception as write:  # the lease is the fallback
            log.warning(
                "workers: could not record the failure of %s (%s); it resumes when its lease ends",
                assignment.id,
                write,
            )

    # -- starting rounds -----------------------------------------------------------------

    async def _claim(self) -> None:
        while True:
            orphan = await slots.take_over(self.pool, owner=self.owner, lease=self.lease)
            if orphan is None:
                break
            log.info("workers: taking over %s of %s", orphan.id, orphan.ticket_id)
            self._launch(orphan)
        for row in await self.pool.fetch(_WAKE, ONLINE_WINDOW):
            started = await self._start(row["id"], row["state"], row["why"], human=row["human"])
            if started is not None and row["state"] == TicketState.WAITING_HUMAN:
                # People stepped in: the rounds nobody asked for count from zero again.
                async with self.pool.acquire() as conn:
                    await pr_rounds.people_woke(conn, started.ticket_id)
        for decision in await pr_rounds.pending(self.pool, self.limits):
            await self._pull_request(decision)

    async def _start(
        self, ticket_id: str, state: str, why: str, *, human: bool
    ) -> slots.Assignment | None:
        started = await slots.start(
            self.pool,
            ticket_id,
            states=(state,),
            woken_by=why,
            owner=self.owner,
            lease=self.lease,
            max_workers=self.limits.max_workers,
            human=human,
        )
        if started is not None:
            log.info("workers: %s for %s (%s)", started.id, started.ticket_id, why)
            self._launch(started)
        return started

    async def _pull_request(self, decision: pr_rounds.Decision) -> None:
        """What a ready ticket's pull request called for: a round, a block, or a hold."""
        ticket_id = decision.ticket_id
        if decision.action == "wake":
            why = "human" if decision.person else "event"
            started = await self._start(ticket_id, TicketState.READY, why, human=decision.person)
            if started is not None:
                async with self.pool.acquire() as conn, conn.transaction():
                    await pr_rounds.started(conn, decision)
        elif decision.action == "block":
            summary = await pr_rounds.block(self.pool, decision)
            if summary is not None:
                log.info("workers: %s blocked: %s", ticket_id, summary)
        elif await pr_rounds.hold_bots(self.pool, decision):
            log.info("workers: %s no longer woken by bots (%s)", ticket_id, pr_rounds.BOT_HOLD)

    # -- housekeeping --------------------------------------------------------------------

    async def _housekeeping(self) -> None:
        await control.cancel_stopped(self.pool, self.queue)
        async with self.pool.acquire() as conn, conn.transaction():
            for ended in await pr_rounds.end_closed(conn):
                log.info("workers: %s %s (its pull request closed)", ended["id"], ended["state"])
        # However a ticket ended, its device may remove its workspace (after its retention).
        for released in await workspace.release_ended(self.pool, self.queue):
            log.info("workers: %s ended; its device releases its workspace", released)
        async with self.pool.acquire() as conn, conn.transaction():
            for row in await store.expire_device_waits(conn):
                thread = await reports.home_thread(conn, row["id"])
                if thread is None:
                    continue
                await enqueue_reply(
                    conn,
                    thread,
                    f"{row['id']} has waited for the device {row['device']} until "
                    f"{row['wait_until']:%Y-%m-%d %H:%M} UTC, and it has not come back. "
                    "Reply `reroute <device>` to move the work to another device, or `drop` "
                    "to stop it.",
                    stable_id("msg", f"device_expired:{row['id']}:{row['wait_until']}"),
                )
        for answer in await inbox.take_device_answers(self.pool):
            await self._answer(answer)
        for asked in await inbox.take_stops(self.pool):
            async with self.pool.acquire() as conn, conn.transaction():
                await control.stop(conn, asked["ticket_id"], by=asked["actor_name"])
            await self._say(
                asked["ticket_id"],
                f"Stopped {asked['ticket_id']}, as {asked['actor_name']} asked.",
                asked["trigger_id"],
            )

    async def _say(self, ticket_id: str, text: str, trigger_id: str) -> None:
        thread = await reports.home_thread(self.pool, ticket_id)
        if thread is not None:
            async with self.pool.acquire() as conn:
                await enqueue_reply(conn, thread, text, stable_id("msg", f"answer:{trigger_id}"))

    async def _answer(self, answer: asyncpg.Record) -> None:
        ticket_id, text, who = answer["ticket_id"], answer["text"], answer["actor_name"]
        said: str
        rerouted = _REROUTE.search(text)
        if rerouted and rerouted.group(1):
            try:
                # Checked like any choice of device, for the ticket's requester; the one who
                # answered counts only as the new device's owner, if they are.
                director = await access.requester_of_trigger(self.pool, answer["trigger_id"])
                moved = await control.reroute(
                    self.pool,
                    ticket_id,
                    rerouted.group(1),
                    by=who,
                    wait=timedelta(seconds=self.limits.device_wait_seconds),
                    director=director.principals,
                )
                name = moved.device
                said = (
                    f"{moved.message}."
                    if moved.approval
                    else f"{ticket_id} moves to the device {name}; it resumes once {name} is "
                    "online."
                )
            except SuperagentError as exc:  # no such device, ...: said back to the person
                said = f"Could not reroute {ticket_id}: {exc}"
        elif _DROP.search(text):
            async with self.pool.acquire() as conn, conn.transaction():
                await control.stop(conn, ticket_id, by=who)
            said = f"Dropped {ticket_id}, as {who} asked."
        else:
            said = f"{ticket_id} is waiting: reply `reroute <device>` or `drop`."
        await self._say(ticket_id, said, answer["trigger_id"])
