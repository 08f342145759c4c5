"""README.md's first ticket against a real model: Qwen2.5-Coder-1.5B-Instruct in llama.cpp's
llama-server on this machine (tests/support/real_model.py), no scripted fake anywhere.

`superagent up --device` runs as a user runs it, with its endpointd, pointed at the server
through ``OPENAI_BASE_URL``, and ``superagent say`` asks what README.md's model step asks.
A small model decides what it decides, so the test asserts only what must hold whatever it
decides:

* every event ends routed with a decision on record, or set aside as undecidable with its
  reason (an event ingest dropped says why); one that ended in silence (routed with no
  decision) fails the test, named, after every other check has passed;
* a ticket, if one is made, ends in a state whose reason ``superagent tickets show`` prints;
* nothing is said twice on a thread;
* no process exits: the control plane, its endpointd and the model server run throughout,
  and ``up`` stops cleanly when asked.

What the model did (the events and decisions, each ticket's transcript, the replies, the
model calls with their timings) and the run's figures (the prompt's cache share, a
ticket's time outside model calls) are written to ``record.txt`` in the test's temporary
directory and printed. Only with ``--real-model`` (``scripts/test --real-model``); the
model and the server come from ``scripts/real_model``'s cache.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import psutil
import pytest

from controlplane.ingest.intake import Intake
from controlplane.tickets import opening
from tests.support import real_model
from tests.support.helpers import assert_eventually
from tests.support.real_model import ALIAS, LlamaServer
from tests.support.up_process import Up, up_in

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

REQUEST = "In {demo} on laptop, add a CONTRIBUTORS file that lists Ada Lovelace"
SAY_WAIT = 600  # README.md's `say --wait 600`
# From the request until nothing is left to do: a cold router prompt alone takes ~30 s
# here and a worker's round several model calls, but a run that has not settled by then is
# a finding, not a slow machine.
SETTLE_SECONDS = 30 * 60
QUIET_SECONDS = 30  # settled this long: no report or reply is on its way
# A ticket in one of these is done for now, waiting on nobody but people.
SETTLED = ("completed", "ready", "waiting_human", "failed", "stopped")


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    with real_model.running(tmp_path_factory.mktemp("llama-server") / "server.log") as server:
        yield server


@pytest.fixture
def up(empty_database: str, tmp_path: Path) -> Iterator[Up]:
    with up_in(tmp_path, empty_database) as runner:
        yield runner


def cli(up: Up, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controlplane.cli", *args],
        env=up.env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=False
    )
    return done.stdout + done.stderr


def log(began: float, message: str) -> None:
    print(f"[{time.monotonic() - began:7.1f} s] {message}", flush=True)


async def fetch(database_url: str, query: str, *args: object) -> list[dict[str, Any]]:
    conn = await asyncpg.connect(database_url)
    try:
        return [dict(row) for row in await conn.fetch(query, *args)]
    finally:
        await conn.close()


async def unsettled(database_url: str) -> list[str]:
    """What is still on its way: events the router has not decided, tickets at work,
    external actions (replies) not yet done. Empty once the run has nothing left to do."""
    waiting = await fetch(
        database_url,
        "SELECT id, kind FROM triggers WHERE route = 'router' AND routed_at IS NULL",
    )
    working = await fetch(
        database_url,
        "SELECT id, state FROM tickets WHERE state <> ALL($1::text[])",
        list(SETTLED),
    )
    effects = await fetch(database_url, "SELECT id, kind FROM effects WHERE dead_at IS NULL")
    return (
        [f"event {t['id']} ({t['kind']}) waits for the router" for t in waiting]
        + [f"ticket {t['id']} is {t['state']}" for t in working]
        + [f"effect {e['id']} ({e['kind']}) is not done" for e in effects]
    )


async def calls_so_far(database_url: str) -> str:
    rows = await fetch(
        database_url, "SELECT outcome, count(*) AS n FROM llm_calls GROUP BY outcome"
    )
    return ", ".join(f"{r['n']} {r['outcome']}" for r in rows) or "none"


def children(up: Up) -> dict[int, str]:
    """The processes `up` started (its endpointd, the watchdog, Postgres is not its)."""
    assert up.process is not None
    found = {}
    for child in psutil.Process(up.process.pid).children(recursive=False):
        try:
            found[child.pid] = " ".join(child.cmdline()[:6])
        except psutil.Error:
            continue
    return found


async def record(database_url: str, up: Up, demo: Path) -> tuple[str, dict[str, Any]]:
    """What happened, as text for a person and as rows for the assertions."""
    rows: dict[str, Any] = {
        "triggers": await fetch(
            database_url,
            "SELECT id, kind, actor_name, route, verdict, verdict_reason, routed_at, "
            "undecidable_at, route_attempts, route_error, text FROM triggers ORDER BY created_at",
        ),
        "decisions": await fetch(
            database_url,
            "SELECT created_at, tool, arguments, trigger_ids, outcome, ok "
            "FROM router_decisions ORDER BY created_at",
        ),
        "tickets": await fetch(
            database_url,
            "SELECT id, title, state, hold, last_error, failed_rounds, branch, workspace "
            "FROM tickets ORDER BY created_at",
        ),
        "sent": await fetch(
            database_url,
            "SELECT thread_id, text, sent_at FROM sent_messages ORDER BY sent_at",
        ),
        "calls": await fetch(
            database_url,
            "SELECT c.created_at, s.kind AS session, c.prompt_tokens, c.cached_tokens, "
            "c.completion_tokens, c.latency_ms, c.outcome, c.error FROM llm_calls c "
            "LEFT JOIN sessions s ON s.id = c.session_id ORDER BY c.created_at",
        ),
    }
    text = ["== events (triggers)"]
    for t in rows["triggers"]:
        state = "undecidable" if t["undecidable_at"] else "routed" if t["routed_at"] else "waiting"
        text.append(
            f"{t['id']} {t['kind']} by {t['actor_name']}: route={t['route']} "
            f"verdict={t['verdict']} ({t['verdict_reason']}) {state}, "
            f"{t['route_attempts']} failed turns, error={t['route_error']!r}"
        )
        text.append(f"    {t['text'][:300]!r}")
    text.append("== router decisions")
    for d in rows["decisions"]:
        arguments = json.dumps(d["arguments"], ensure_ascii=False)[:400]
        text.append(
            f"{d['created_at']:%H:%M:%S} {d['tool']} ok={d['ok']} on {d['trigger_ids']}: "
            f"{d['outcome'][:300]}\n    {arguments}"
        )
    text.append("== replies (sent_messages)")
    for s in rows["sent"]:
        text.append(f"{s['sent_at']:%H:%M:%S} {s['thread_id']}: {s['text'][:500]!r}")
    text.append("== model calls")
    for c in rows["calls"]:
        text.append(
            f"{c['created_at']:%H:%M:%S} {c['session'] or '-':<8} prompt {c['prompt_tokens']:>5} "
            f"(cached {c['cached_tokens']:>5}) completion {c['completion_tokens']:>4} "
            f"{c['latency_ms'] / 1000:6.1f} s {c['outcome']} {c['error'] or ''}"
        )
    for ticket in rows["tickets"]:
        shown = cli(up, "tickets", "show", ticket["id"])
        transcript = cli(up, "tickets", "show", ticket["id"], "--transcript")
        ticket["shown"] = shown.stdout
        text += [f"== superagent tickets show {ticket['id']}", shown.stdout + shown.stderr]
        text += ["== --transcript", transcript.stdout + transcript.stderr]
    branches = git(demo, "log", "--oneline", "--branches=superagent/*")
    text += ["== git log --branches='superagent/*'", branches]
    text += ["== figures (bench/RESULTS.md, *Real-model figures*)", *await figures(database_url)]
    return "\n".join(text), rows


async def figures(database_url: str) -> list[str]:
    """The run's numbers: each session kind's prompt tokens served from the model server's
    cache (all calls, and all but the session's first, cold one), and each ticket's time
    from its creation to its first report that is not progress, split into its worker's
    model calls, its commands on the device, and the rest (the product's own time)."""
    lines = []
    for kind in ("router", "worker"):
        calls = await fetch(
            database_url,
            "SELECT c.session_id, c.prompt_tokens, c.cached_tokens FROM llm_calls c "
            "JOIN sessions s ON s.id = c.session_id WHERE s.kind = $1 AND c.outcome = 'ok' "
            "ORDER BY c.created_at, c.id",
            kind,
        )
        seen: set[str] = set()
        warm = []
        for call in calls:
            if call["session_id"] in seen:
                warm.append(call)
            seen.add(call["session_id"])
        for label, chosen in (("all calls", calls), ("after each session's first", warm)):
            prompt = sum(c["prompt_tokens"] for c in chosen)
            cached = sum(c["cached_tokens"] for c in chosen)
            share = f"{cached / prompt:.0%}" if prompt else "-"
            lines.append(
                f"{kind}: {len(chosen)} calls ({label}): {cached} of {prompt} prompt tokens "
                f"from the server's cache ({share})"
            )
    tickets = await fetch(
        database_url,
        "SELECT t.id, extract(epoch FROM (SELECT min(r.created_at) FROM reports r "
        "WHERE r.ticket_id = t.id AND r.status <> 'progress') - t.created_at) AS seconds, "
        "(SELECT coalesce(sum(c.latency_ms), 0) FROM llm_calls c JOIN sessions s "
        "ON s.id = c.session_id WHERE s.ticket_id = t.id) / 1000.0 AS model, "
        "(SELECT coalesce(sum(extract(epoch FROM m.finished_at - m.created_at)), 0) "
        "FROM commands m WHERE m.ticket_id = t.id AND m.finished_at IS NOT NULL) AS commands "
        "FROM tickets t ORDER BY t.created_at",
    )
    for t in tickets:
        if t["seconds"] is None:
            lines.append(f"{t['id']}: no report yet")
            continue
        total, model, commands = float(t["seconds"]), float(t["model"]), float(t["commands"])
        lines.append(
            f"{t['id']}: {total:.1f} s to its report: model calls {model:.1f} s, commands "
            f"{commands:.1f} s, the rest {total - model - commands:.1f} s"
        )
    return lines


def with_the_model(up: Up, llama_server: LlamaServer) -> None:
    """``up``'s environment pointed at the model server, as README.md's model step does."""
    up.env.update(
        {
            "OPENAI_BASE_URL": llama_server.url,
            "OPENAI_API_KEY": "local",  # llama-server asks for none; any key is taken
            "SUPERAGENT_LLM__ROUTER_MODEL": ALIAS,
            "SUPERAGENT_LLM__WORKER_MODEL": ALIAS,
            # The window each of the server's slots has, as a team would configure it.
            "SUPERAGENT_LLM__ROUTER_CONTEXT_TOKENS": str(llama_server.window),
            "SUPERAGENT_LLM__WORKER_CONTEXT_TOKENS": str(llama_server.window),
        }
    )


async def device_online(up: Up, database_url: str, tmp_path: Path) -> tuple[Path, dict[int, str]]:
    """README.md's device: ``up --device`` over ``src`` with an empty repository ``demo`` in
    it, online. Returns the repository and what ``up`` started."""
    src = tmp_path / "src"
    demo = src / "demo"
    demo.mkdir(parents=True)
    git(demo, "init", "-q")
    who = ("-c", "user.name=Ada", "-c", "user.email=ada@example.com")
    git(demo, *who, "commit", "-q", "--allow-empty", "-m", "Start")

    up.start("--device", str(src), "--device-name", "laptop")

    async def online() -> bool:
        try:
            rows = await fetch(
                database_url,
                "SELECT 1 FROM devices WHERE name = 'laptop' AND connected_replica IS NOT NULL",
            )
        except asyncpg.UndefinedTableError:
            return False  # not migrated yet
        return bool(rows)

    await assert_eventually(online, timeout=180)
    started = children(up)
    assert any("endpointd" in c for c in started.values()), started
    return demo, started


async def settle(up: Up, llama_server: LlamaServer, database_url: str, began: float) -> list[str]:
    """Wait until nothing is left to do (quiet for QUIET_SECONDS), a process exits, or
    SETTLE_SECONDS pass; what is still on its way, if anything."""
    deadline = time.monotonic() + SETTLE_SECONDS
    quiet_since: float | None = None
    last_note = 0.0
    left: list[str] = []
    while time.monotonic() < deadline:
        assert up.process is not None
        if up.process.poll() is not None or not llama_server.alive():
            break
        left = await unsettled(database_url)
        now = time.monotonic()
        quiet_since = (quiet_since or now) if not left else None
        if quiet_since is not None and now - quiet_since >= QUIET_SECONDS:
            break
        if now - last_note >= 60:
            last_note = now
            calls = await calls_so_far(database_url)
            log(began, f"model calls: {calls}; on its way: {left or 'nothing'}")
        await asyncio.sleep(5)
    log(began, f"settled: {not left}; model calls: {await calls_so_far(database_url)}")
    return left


def nothing_exited(up: Up, llama_server: LlamaServer, started: dict[int, str]) -> None:
    """The control plane and what it started, and the model server, all still run."""
    assert up.process is not None
    assert up.process.poll() is None, f"up exited {up.process.returncode}:\n{up.output()}"
    gone = {pid: c for pid, c in started.items() if not psutil.pid_exists(pid)}
    assert not gone, f"these children of up exited: {gone}\n{up.output()}"
    assert llama_server.alive(), f"llama-server exited:\n{llama_server.output()[-3000:]}"


def settled_with_reasons(rows: dict[str, Any]) -> None:
    """Each ticket ends in a state whose reason `tickets show` prints; nothing is said
    twice on a thread."""
    for ticket in rows["tickets"]:
        assert ticket["state"] in SETTLED, ticket
        reason = ticket["hold"] or ticket["last_error"]
        assert reason, f"{ticket['id']} is {ticket['state']} with no reason on record"
        assert reason in ticket["shown"], (
            f"`superagent tickets show {ticket['id']}` does not say why it is "
            f"{ticket['state']} ({reason!r}):\n{ticket['shown']}"
        )
    said_on: dict[tuple[str, str], int] = {}
    for message in rows["sent"]:
        key = (message["thread_id"], message["text"])
        said_on[key] = said_on.get(key, 0) + 1
    twice = {key: n for key, n in said_on.items() if n > 1}
    assert not twice, f"said more than once: {twice}"


def stopped_cleanly(up: Up) -> None:
    """`up` stops cleanly when asked, as Ctrl-C would."""
    assert up.process is not None
    up.process.send_signal(signal.SIGINT)
    assert up.process.wait(60) == 0, up.output()


async def write_record(
    up: Up, llama_server: LlamaServer, database_url: str, demo: Path, tmp_path: Path
) -> dict[str, Any]:
    text, rows = await record(database_url, up, demo)
    (tmp_path / "record.txt").write_text(text)
    print(f"\n{text}\n(record: {tmp_path / 'record.txt'}; server log: {llama_server.log})")
    return rows


@pytest.mark.timeout(SETTLE_SECONDS + 15 * 60)
async def test_the_readmes_first_ticket_with_a_real_model(
    llama_server: LlamaServer, up: Up, empty_database: str, tmp_path: Path
) -> None:
    began = time.monotonic()
    with_the_model(up, llama_server)
    demo, started = await device_online(up, empty_database, tmp_path)
    log(began, f"up is ready, device 'laptop' online; children: {started}")

    request = REQUEST.format(demo=demo)
    said = await asyncio.to_thread(
        cli, up, "say", "--wait", str(SAY_WAIT), request, timeout=SAY_WAIT + 120
    )
    log(began, f"say exited {said.returncode}:\n{said.stdout}{said.stderr}")
    left = await settle(up, llama_server, empty_database, began)
    rows = await write_record(up, llama_server, empty_database, demo, tmp_path)

    nothing_exited(up, llama_server, started)
    assert not left, f"not settled {SETTLE_SECONDS} s after the request: {left}"

    # Every event ends routed with a decision on record, or undecidable with its reason.
    decided = {t for d in rows["decisions"] if d["ok"] for t in d["trigger_ids"]}
    silent = []
    for t in rows["triggers"]:
        assert t["route"] is not None, f"ingest never routed {t['id']}"
        if t["route"] == "dropped":
            assert t["verdict_reason"], f"{t['id']} was dropped without a reason"
        elif t["route"] == "router":
            if t["undecidable_at"] is not None:
                assert t["route_error"], f"{t['id']} is undecidable without a reason"
            elif t["id"] not in decided:
                silent.append(
                    f"{t['id']} ({t['kind']}: {t['text'][:200]!r}) was marked routed, but no "
                    f"decision of the router's was accepted on it: it ended in silence"
                )

    settled_with_reasons(rows)

    stopped_cleanly(up)
    log(began, "done")

    # Checked last, so that everything above is seen first: no request ends in silence (a
    # router turn that decides an event is quarantined with its reason, the person told).
    assert not silent, "; ".join(silent)


@pytest.mark.timeout(SETTLE_SECONDS + 15 * 60)
async def test_a_ticket_worked_by_a_real_model(
    llama_server: LlamaServer, up: Up, empty_database: str, tmp_path: Path
) -> None:
    """The worker's side, whatever the router's model makes of the request: README.md's
    request opened as a ticket the way the router's ``create_ticket`` opens one
    (``controlplane.tickets.opening``, on the laptop, in ``demo``), then worked by the
    real model through a real endpointd in the ticket's own worktree. The agent is paused
    while the request is recorded and the ticket opened, so the router's turn is not part
    of it."""
    began = time.monotonic()
    with_the_model(up, llama_server)
    demo, started = await device_online(up, empty_database, tmp_path)
    log(began, f"up is ready, device 'laptop' online; children: {started}")

    paused = cli(up, "pause", "--reason", "the test opens the ticket itself")
    assert paused.returncode == 0, paused.stderr
    request = REQUEST.format(demo=demo)
    sent = cli(up, "say", "--no-wait", request)
    assert sent.returncode == 0, sent.stderr
    pool = await asyncpg.create_pool(empty_database, min_size=1, max_size=2)
    try:
        trigger = await pool.fetchval("SELECT id FROM triggers WHERE text = $1", request)
        assert trigger is not None
        async with pool.acquire() as conn, conn.transaction():
            opened = await opening.open_ticket(
                conn,
                opening.Request(
                    title="Add a CONTRIBUTORS file that lists Ada Lovelace",
                    scope=request,
                    threads=[],
                    mandate_from=trigger,
                    device="laptop",
                    workdir=str(demo),
                ),
                Intake(pool).policy,
            )
            await conn.execute("UPDATE triggers SET routed_at = now() WHERE id = $1", trigger)
    finally:
        await pool.close()
    log(began, f"opened {opened.ticket_id} on laptop; resuming")
    resumed = cli(up, "resume")
    assert resumed.returncode == 0, resumed.stderr

    left = await settle(up, llama_server, empty_database, began)
    rows = await write_record(up, llama_server, empty_database, demo, tmp_path)

    nothing_exited(up, llama_server, started)
    assert not left, f"not settled {SETTLE_SECONDS} s after the ticket opened: {left}"
    (ticket,) = rows["tickets"]
    assert ticket["id"] == opened.ticket_id
    settled_with_reasons(rows)
    # The person hears how it ended: a report of the worker's, relayed, on their thread.
    assert rows["sent"], "nothing was said on the request's thread"
    stopped_cleanly(up)
    log(began, "done")
