"""What the harness round adds to a coding-agent CLI's run, against the same CLI run
by hand on the same task.

Run by hand (never in CI), from the repository root, after ``scripts/bootstrap`` (which
installs Qwen Code into ``.tools/harnesses``)::

    python -m bench.harness_overhead [--runs 5]

Both sides run Qwen Code 0.24.4 against the same scripted OpenAI-compatible fake (read
calc.py, write the fix, say so: three model calls), on the same repository, alternating:

* **by hand**: ``qwen`` started in a fresh clone with the flags endpointd uses (stream-json,
  yolo, safe mode, the model and endpoint, the key in its environment), the instruction on
  stdin; timed from this process: spawn to its first event line, last event line to exit.
* **supervised**: the whole product (``tests/support/e2e_world.py``: ``superagent serve``,
  a real endpointd over gRPC/TLS with the harness allowed in its policy and its key in its
  keyring, the git server, the GitHub fake, the scripted router). A GitHub comment asks for
  the fix with qwen. Timed from the control plane's own records: the round's start
  (``assignments.created_at``) to the harness's first event recorded
  (``harness_runs.first_event_at``), and the last event recorded
  (``harness_runs.last_event_at``) to the report (``reports.created_at``).

The supervised "before" holds the ticket's workspace (a git worktree), reading the
repository's config and instructions, composing the instruction, the device's command
path (journal, policy, sandbox, credential) and Qwen Code's own start; its "after" holds
the repository's tests, the commit, the push through the git helper, the pull request
through the outbox and the report. By hand, "after" is only the CLI's exit: the person
still has to test, commit, push and open the pull request.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

from controlplane.db import migrate
from controlplane.db.embedded import EmbeddedPostgres
from endpointd.rules.harnesses import HARNESSES, Run
from tests.fakes.openai_server import FakeOpenAIServer
from tests.support.e2e_world import CREDENTIAL, REPO, git, running_world, start, webhook
from tests.support.harness_world import (
    FIXED,
    HARNESS_MODEL,
    Harness,
    Router,
    comment,
    device_policy,
    qwen,
    repository_files,
    store_key,
)
from tests.support.helpers import assert_eventually

PROMPT = (
    "Ticket tkt_bench: Fix add()\nWorkspace: {workspace}, a git worktree of its own.\n\n"
    "Make test_add pass. End with a short summary."
)


def by_hand(tmp: Path, harness_llm: FakeOpenAIServer, seed: Path, index: int) -> dict[str, float]:
    """One qwen run by hand: seconds from spawn to its first event, and from its last
    event to its exit."""
    workspace = tmp / f"hand-{index}"
    git("clone", "-q", str(seed), str(workspace), cwd=tmp)
    home = tmp / f"hand-home-{index}"
    home.mkdir()
    # The argv endpointd builds for this harness (its own table), without the sandbox.
    spec = HARNESSES["qwen"]
    argv = spec.argv(
        Run(str(qwen()), model=HARNESS_MODEL, base_url=harness_llm.url, openai_key=True)
    )
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "OPENAI_API_KEY": "sk-bench"}
    env |= spec.env
    started = time.monotonic()
    proc = subprocess.Popen(
        argv,
        cwd=workspace,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    proc.stdin.write(PROMPT.format(workspace=workspace).encode())
    proc.stdin.close()
    first = last = None
    for line in proc.stdout:
        if line.startswith(b"{"):
            now = time.monotonic()
            first = first if first is not None else now
            last = now
    proc.wait(timeout=120)
    ended = time.monotonic()
    assert first is not None
    assert last is not None
    assert proc.returncode == 0, proc.returncode
    assert (workspace / "calc.py").read_text() == FIXED, "qwen by hand did not make the fix"
    return {"before": first - started, "after": ended - last, "total": ended - started}


async def supervised(world: Any, pool: asyncpg.Pool, index: int) -> dict[str, float]:
    """One ticket worked by qwen through the product: the control plane's own timings."""
    # Issues and pull requests share GitHub's numbers: each run asks on a new issue.
    issue = int(world.github.open_issue(REPO, f"add() is broken ({index})")["number"])
    title = f"Harness: fix add() {issue}"
    await webhook(
        world,
        "issue_comment",
        comment(9000 + issue, f"@superagent fix add() {issue} with qwen", issue),
        f"bench-{issue}",
    )

    async def ready() -> asyncpg.Record:
        row = await pool.fetchrow("SELECT id, state, hold FROM tickets WHERE title = $1", title)
        assert row is not None
        assert row["state"] == "ready", (row["state"], row["hold"])
        return row

    ticket = await assert_eventually(ready, timeout=300, interval=0.2, message=title)
    row = await pool.fetchrow(
        """
        SELECT (SELECT min(created_at) FROM assignments WHERE ticket_id = $1) AS round_at,
               h.first_event_at, h.last_event_at,
               (SELECT min(created_at) FROM reports WHERE ticket_id = $1 AND status = 'ready')
                   AS report_at
        FROM harness_runs h WHERE h.ticket_id = $1 ORDER BY h.created_at LIMIT 1
        """,
        ticket["id"],
    )
    assert row is not None
    before = (row["first_event_at"] - row["round_at"]).total_seconds()
    after = (row["report_at"] - row["last_event_at"]).total_seconds()
    total = (row["report_at"] - row["round_at"]).total_seconds()
    return {"before": before, "after": after, "total": total}


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="harness-bench-") as scratch:
        tmp = Path(scratch)
        pg = EmbeddedPostgres(tmp / "pg")
        url = pg.start()
        try:
            await migrate.upgrade(url)
            await run(args, tmp, url)
        finally:
            pg.stop()


async def run(args: argparse.Namespace, tmp: Path, url: str) -> None:
    fake_llm, harness_llm = FakeOpenAIServer(), FakeOpenAIServer(api_key=None)
    fake_llm.start()
    harness_llm.start()
    harness_llm.respond_with(Harness())
    engine = create_async_engine(url.replace("postgresql://", "postgresql+asyncpg://", 1))
    db = async_sessionmaker(engine, expire_on_commit=False)
    pool = await asyncpg.create_pool(url, min_size=1, max_size=4)
    seed = tmp / "hand-seed"
    seed.mkdir()
    for name, text in repository_files(CREDENTIAL).items():
        (seed / name).parent.mkdir(parents=True, exist_ok=True)
        (seed / name).write_text(text)
    git("init", "-q", "-b", "main", cwd=seed)
    git("add", "-A", cwd=seed)
    git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "s", cwd=seed)
    (tmp / "world").mkdir()
    hand: list[dict[str, float]] = []
    ours: list[dict[str, float]] = []
    try:
        with running_world(
            tmp / "world",
            url,
            fake_llm,
            files=repository_files(CREDENTIAL),
            script=lambda _: Router(),
        ) as world:
            store_key(world, "sk-bench-" + os.urandom(8).hex())
            await start(world, pool, db, policy=device_policy(harness_llm))
            by_hand(tmp, harness_llm, seed, -1)  # warm up: node's caches, the fake
            for index in range(args.runs):
                hand.append(await asyncio.to_thread(by_hand, tmp, harness_llm, seed, index))
                ours.append(await supervised(world, pool, index))
                print(f"run {index + 1}: by hand {hand[-1]}, supervised {ours[-1]}", flush=True)
    finally:
        await pool.close()
        await engine.dispose()
        with contextlib.suppress(Exception):
            fake_llm.stop()
            harness_llm.stop()
    report(hand, ours, args.runs)


def report(hand: list[dict[str, float]], ours: list[dict[str, float]], runs: int) -> None:
    load = os.getloadavg()[0]
    print(f"\nQwen Code, {runs} runs each, load average {load:.2f} at the end\n")
    print("| Stage (p50, s) | by hand | supervised | supervised - by hand | ratio |")
    print("|---|---|---|---|---|")
    for key, label in (
        ("before", "start to first event"),
        ("after", "last event to end (hand: exit; supervised: report)"),
        ("total", "start to end"),
    ):
        a = statistics.median(h[key] for h in hand)
        b = statistics.median(o[key] for o in ours)
        print(f"| {label} | {a:.2f} | {b:.2f} | {b - a:+.2f} | {b / a:.2f}x |")


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each side (default 5)")
    asyncio.run(main(parser.parse_args()))


if __name__ == "__main__":
    cli()
