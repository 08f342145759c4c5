"""Prometheus metrics at ``GET /metrics``, read from Postgres at scrape time.

Every number describes the deployment and comes from the database all replicas share, read
when Prometheus asks: any replica answers with the same truth, and nothing kept in memory
has to survive a restart. Only the ``superagent_scrape_*`` metrics are about this process.

Each group of metrics is read on a connection of its own within ``SCRAPE_TIMEOUT``, so a
slow database never hangs a scrape: a group it does not answer in time is left out and
reported by ``superagent_scrape_up{group="…"} 0``. docs/operations.md lists the metrics.

Access: ``Authorization: Bearer <admin token>``, as every other surface (no address is
trusted for looking local).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Annotated, Any

import asyncpg
from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from controlplane import logs
from controlplane.access import authentication
from controlplane.db import outage
from controlplane.db.pool import Conn
from controlplane.domain import LIVE_COMMAND_STATES, TicketState
from controlplane.errors import Unauthorized
from controlplane.gateway.devices import ONLINE_WINDOW
from controlplane.settings import Settings
from controlplane.web.state import AppState, app_state

log = logging.getLogger(__name__)

# Well inside Prometheus' default scrape timeout (10 s): a scrape that gives up answers
# with what it has, rather than being dropped whole by Prometheus.
SCRAPE_TIMEOUT = 2.0
# The classic text format, which every Prometheus reads (newer clients default to 1.0.0).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
EFFECT_STATES = ("ready", "running", "backoff", "dead")
LATENCY_BUCKETS = (0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)  # seconds

Read = Callable[[Conn], Awaitable[list[Metric]]]
# A group not read in time, or a database that is away: the scrape goes on without it.
_UNREAD: tuple[type[Exception], ...] = (TimeoutError, *outage.DATABASE_ERRORS)
State = Annotated[AppState, Depends(app_state)]


def _gauge_by(
    name: str, documentation: str, label: str, known: Iterable[str], counts: Mapping[str, int]
) -> GaugeMetricFamily:
    """A gauge per label value: every known value (0 when absent), and any other found."""
    family = GaugeMetricFamily(name, documentation, labels=[label])
    for value in dict.fromkeys([*known, *counts]):
        family.add_metric([value], counts.get(value, 0))
    return family


async def _queues(conn: Conn) -> list[Metric]:
    inboxes = await conn.fetchrow(
        "SELECT (SELECT count(*) FROM triggers WHERE routed_at IS NULL) AS router, "
        "(SELECT count(*) FROM ticket_inbox "
        " WHERE read_at IS NULL AND handed_back_at IS NULL) AS tickets"
    )
    assert inboxes is not None
    commands = await conn.fetch(
        "SELECT state, count(*) FROM commands WHERE state = ANY($1::text[]) GROUP BY state",
        list(LIVE_COMMAND_STATES),
    )
    tickets = await conn.fetch("SELECT state, count(*) FROM tickets GROUP BY state")
    return [
        GaugeMetricFamily(
            "superagent_router_inbox",
            "Events waiting for the router (triggers not routed yet).",
            value=inboxes["router"],
        ),
        GaugeMetricFamily(
            "superagent_ticket_inbox_unread",
            "Events passed through to tickets that their workers have not taken yet.",
            value=inboxes["tickets"],
        ),
        _gauge_by(
            "superagent_commands",
            "Device commands not finished yet, by state.",
            "state",
            LIVE_COMMAND_STATES,
            {row[0]: row[1] for row in commands},
        ),
        _gauge_by(
            "superagent_tickets",
            "Tickets by state.",
            "state",
            tuple(TicketState),
            {row[0]: row[1] for row in tickets},
        ),
    ]


async def _effects(conn: Conn) -> list[Metric]:
    # A claimed effect's next_attempt_at is its lease, so "due" covers both the unclaimed
    # and those whose runner died.
    row = await conn.fetchrow(
        "SELECT "
        "count(*) FILTER (WHERE dead_at IS NULL AND next_attempt_at <= now()) AS ready, "
        "count(*) FILTER (WHERE dead_at IS NULL AND next_attempt_at > now() "
        "  AND locked_by IS NOT NULL) AS running, "
        "count(*) FILTER (WHERE dead_at IS NULL AND next_attempt_at > now() "
        "  AND locked_by IS NULL) AS backoff, "
        "count(*) FILTER (WHERE dead_at IS NOT NULL) AS dead, "
        "coalesce(sum(greatest(attempts - 1, 0)) FILTER (WHERE dead_at IS NULL), 0) "
        "  AS retries "
        "FROM effects"
    )
    assert row is not None
    return [
        _gauge_by(
            "superagent_effects",
            "Effects in the outbox: ready (due now), running (claimed), backoff (waiting "
            "for a retry or a delayed start), dead (gave up; see last_error).",
            "state",
            EFFECT_STATES,
            {state: row[state] for state in EFFECT_STATES},
        ),
        GaugeMetricFamily(
            "superagent_effect_retries",
            "Retries so far (attempts beyond the first) of the effects still in the outbox.",
            value=int(row["retries"]),
        ),
    ]


async def _decisions(conn: Conn) -> list[Metric]:
    rows = await conn.fetch(
        "SELECT tool, ok, count(*) FROM router_decisions GROUP BY tool, ok ORDER BY 1, 2"
    )
    family = CounterMetricFamily(
        "superagent_router_decisions",
        "What the router did: tool calls by tool, and whether each was carried out.",
        labels=["tool", "ok"],
    )
    for tool, ok, count in rows:
        family.add_metric([tool, "true" if ok else "false"], count)
    return [family]


_BUCKET_COLUMNS = ", ".join(
    f"count(*) FILTER (WHERE c.latency_ms <= {round(bound * 1000)}) AS le_{i}"
    for i, bound in enumerate(LATENCY_BUCKETS)
)
_LLM = f"""
SELECT coalesce(s.kind, 'none') AS kind, c.model, count(*) AS calls,
    count(*) FILTER (WHERE c.error IS NOT NULL) AS errors,
    coalesce(sum(c.prompt_tokens), 0) AS prompt,
    coalesce(sum(c.completion_tokens), 0) AS completion,
    coalesce(sum(c.cached_tokens), 0) AS cached, coalesce(sum(c.cost_usd), 0) AS cost,
    coalesce(sum(c.latency_ms), 0) AS latency_ms, {_BUCKET_COLUMNS}
FROM llm_calls c LEFT JOIN sessions s ON s.id = c.session_id
GROUP BY 1, 2 ORDER BY 1, 2
"""
_LLM_OUTCOMES = """
SELECT coalesce(s.kind, 'none') AS kind, c.model, c.outcome, count(*) AS calls
FROM llm_calls c LEFT JOIN sessions s ON s.id = c.session_id
GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
"""


async def _llm(conn: Conn) -> list[Metric]:
    labels = ["kind", "model"]
    calls = CounterMetricFamily(
        "superagent_llm_calls", "Model calls, by session kind and model.", labels=labels
    )
    errors = CounterMetricFamily(
        "superagent_llm_errors",
        "Model calls that failed, by session kind and model.",
        labels=labels,
    )
    tokens = CounterMetricFamily(
        "superagent_llm_tokens",
        "Tokens of model calls by type: prompt, completion, and cached (the part of the "
        "prompt read from the provider's cache).",
        labels=[*labels, "type"],
    )
    cost = CounterMetricFamily(
        "superagent_llm_cost_usd", "What model calls cost, in US dollars.", labels=labels
    )
    latency = HistogramMetricFamily(
        "superagent_llm_latency_seconds",
        "How long model calls took, failed ones included.",
        labels=labels,
    )
    for row in await conn.fetch(_LLM):
        key = [row["kind"], row["model"]]
        calls.add_metric(key, row["calls"])
        errors.add_metric(key, row["errors"])
        for kind in ("prompt", "completion", "cached"):
            tokens.add_metric([*key, kind], row[kind])
        cost.add_metric(key, float(row["cost"]))
        buckets = [(str(float(bound)), row[f"le_{i}"]) for i, bound in enumerate(LATENCY_BUCKETS)]
        latency.add_metric(key, [*buckets, ("+Inf", row["calls"])], row["latency_ms"] / 1000)
    outcomes = CounterMetricFamily(
        "superagent_llm_outcomes",
        "Model call attempts by outcome class: ok, transient (retried), context (the "
        "prompt did not fit), permanent, malformed.",
        labels=[*labels, "outcome"],
    )
    for row in await conn.fetch(_LLM_OUTCOMES):
        outcomes.add_metric([row["kind"], row["model"], row["outcome"]], row["calls"])
    return [calls, errors, tokens, cost, latency, outcomes]


async def _devices(conn: Conn) -> list[Metric]:
    # Online as `superagent devices list` judges it: a stream held, and heard of lately
    # (a replica killed with SIGKILL cannot clear connected_replica).
    row = await conn.fetchrow(
        "SELECT count(*) FILTER (WHERE connected_replica IS NOT NULL "
        "  AND last_seen_at > now() - CAST($1 AS interval)) AS online, "
        "count(*) AS paired "
        "FROM devices WHERE revoked_at IS NULL",
        ONLINE_WINDOW,
    )
    assert row is not None
    return [
        GaugeMetricFamily(
            "superagent_devices_online", "Paired devices connected now.", value=row["online"]
        ),
        GaugeMetricFamily(
            "superagent_devices_paired", "Devices paired and not revoked.", value=row["paired"]
        ),
    ]


async def _failures(conn: Conn) -> list[Metric]:
    """Items that failed (controlplane.failures), and what is quarantined now."""
    rows = await conn.fetch(
        "SELECT loop, error_class, count(*) AS n, count(*) FILTER (WHERE quarantined) AS q "
        "FROM item_failures GROUP BY loop, error_class ORDER BY 1, 2"
    )
    failed = CounterMetricFamily(
        "superagent_item_failures",
        "Items a loop failed to handle (a router turn, a worker round, an effect, a check), "
        "by loop and class; class internal is an exception in our own code (a bug).",
        labels=["loop", "class"],
    )
    given_up = CounterMetricFamily(
        "superagent_item_quarantines",
        "Failures that were an item's last try: it was set aside with its reason.",
        labels=["loop", "class"],
    )
    for row in rows:
        failed.add_metric([row["loop"], row["error_class"]], row["n"])
        given_up.add_metric([row["loop"], row["error_class"]], row["q"])
    held = await conn.fetchrow(
        "SELECT (SELECT count(*) FROM triggers WHERE undecidable_at IS NOT NULL "
        "  AND routed_at IS NOT NULL) AS triggers, "
        "(SELECT count(*) FROM tickets WHERE state = 'waiting_human' "
        "  AND hold = 'blocked') AS tickets, "
        "(SELECT count(*) FROM effects WHERE dead_at IS NOT NULL) AS effects"
    )
    assert held is not None
    return [
        failed,
        given_up,
        _gauge_by(
            "superagent_quarantined",
            "What waits for people now: undecidable events (superagent triggers retry), "
            "blocked tickets (superagent tickets retry), dead effects.",
            "kind",
            ("triggers", "tickets", "effects"),
            {"triggers": held["triggers"], "tickets": held["tickets"], "effects": held["effects"]},
        ),
    ]


GROUPS: dict[str, Read] = {
    "queues": _queues,
    "effects": _effects,
    "decisions": _decisions,
    "llm": _llm,
    "devices": _devices,
    "failures": _failures,
}


class Snapshot(Collector):
    """Metric families already read. prometheus_client collects synchronously and the
    database is read asynchronously, so the scrape reads first and this serves it."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


class Scraper:
    """Reads every group at once, each bounded by ``timeout``."""

    def __init__(self, timeout: float = SCRAPE_TIMEOUT) -> None:
        self.timeout = timeout
        self.errors = dict.fromkeys(GROUPS, 0)  # this process's failed reads, per group

    async def scrape(self, pool: asyncpg.Pool) -> Snapshot:
        started = time.monotonic()
        results = await asyncio.gather(*(self._read(pool, g, r) for g, r in GROUPS.items()))
        up = GaugeMetricFamily(
            "superagent_scrape_up",
            "1 when the database answered this group of metrics in time, else 0 (its "
            "metrics are missing from this scrape).",
            labels=["group"],
        )
        errors = CounterMetricFamily(
            "superagent_scrape_errors",
            "Groups of metrics this replica could not read, since it started.",
            labels=["group"],
        )
        families: list[Metric] = []
        for group, result in zip(GROUPS, results, strict=True):
            up.add_metric([group], 0 if result is None else 1)
            errors.add_metric([group], self.errors[group])
            families.extend(result or [])
        duration = GaugeMetricFamily(
            "superagent_scrape_duration_seconds",
            "How long this scrape took to read the database.",
            value=time.monotonic() - started,
        )
        return Snapshot([*families, up, errors, duration])

    async def _read(self, pool: asyncpg.Pool, group: str, read: Read) -> list[Metric] | None:
        try:
            async with asyncio.timeout(self.timeout):
                async with pool.acquire() as conn, conn.transaction():
                    # The server gives up a little before we do, so that a slow query is
                    # cancelled there rather than only abandoned here.
                    budget_ms = max(int(self.timeout * 900), 1)
                    await conn.execute(f"SET LOCAL statement_timeout = {budget_ms}")
                    return await read(conn)
        except _UNREAD as exc:
            # A slow or unreachable database: a partial answer beats none.
            self.errors[group] += 1
            detail = str(exc).strip().splitlines()[0] if str(exc).strip() else "no answer"
            log.warning("metrics: group %s not read (%s: %s)", group, type(exc).__name__, detail)
            return None
        except Exception:  # a bug in one group must not take the others down with it
            self.errors[group] += 1
            log.exception("metrics: group %s failed", group)
            return None


def authorize(request: Request, settings: Settings) -> None:
    """Raise Unauthorized unless ``request`` may read the metrics: the admin token as a
    bearer header (Prometheus: ``authorization.credentials_file``), as every surface."""
    try:
        authentication.principal(request)
    except Unauthorized:
        raise Unauthorized(
            "/metrics needs the admin token: send 'Authorization: Bearer "
            "<SUPERAGENT_ADMIN_TOKEN>' (Prometheus: authorization.credentials_file)"
        ) from None


def install(app: FastAPI, *, timeout: float = SCRAPE_TIMEOUT) -> None:
    """The operations surface of ``app``: ``GET /metrics``, and trace ids on requests."""
    logs.install(app)
    scraper = Scraper(timeout)

    @app.get(
        "/metrics",
        tags=["health"],
        summary="Prometheus metrics (text format 0.0.4), read from the shared database",
        response_class=Response,
        responses={200: {"content": {"text/plain": {}}}},
    )
    async def metrics(request: Request, state: State) -> Any:
        authorize(request, state.settings)
        snapshot = await scraper.scrape(state.pool)
        return Response(generate_latest(snapshot), media_type=CONTENT_TYPE)
