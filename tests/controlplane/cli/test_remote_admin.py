"""Managing a deployed control plane from another machine: `superagent login URL` with a
named token, then the admin commands over HTTP only, as the token's holder.

The CLI runs from a HOME of its own with no way to the database (DATABASE_URL points at a
port nothing listens on, and no admin-token file is in reach), against a real `serve`
replica: whatever works, worked over HTTP. What it did is on record under the token's
name, not a self-declared one.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import click
import httpx
import pytest

from controlplane.cli import contexts, dbsession
from controlplane.db import migrate
from controlplane.db.urls import asyncpg_dsn
from controlplane.gateway.delivery import CommandDelivery
from controlplane.settings import Settings
from controlplane.tickets import reports
from controlplane.workers import timeline
from tests.support.helpers import assert_eventually, free_port, run_cli
from tests.support.worker_harness import LocalDevice, ticket

pytestmark = pytest.mark.slow

NOWHERE = "postgresql://nobody@127.0.0.1:9/nothing"  # a database the client must not need


class Client:
    """`superagent` on another machine: its own HOME, no database, no admin-token file."""

    def __init__(self, home: Path) -> None:
        home.mkdir(parents=True, exist_ok=True)
        self.home = home
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("SUPERAGENT_", "OPENAI_", "XDG_")) and k != "DATABASE_URL"
        }
        self.env.update(
            {
                "HOME": str(home),
                "DATABASE_URL": NOWHERE,
                "SUPERAGENT_STATE_DIR": str(home / "state"),
            }
        )

    def run(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "controlplane.cli", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            env=self.env,
            check=False,
        )

    def ok(self, *args: str, stdin: str | None = None) -> str:
        done = self.run(*args, stdin=stdin)
        assert done.returncode == 0, f"superagent {' '.join(args)}: {done.stderr}"
        assert "Traceback" not in done.stderr
        return done.stdout


@pytest.fixture
async def served(empty_database: str, tmp_path: Path) -> AsyncIterator[str]:
    """A `serve` replica on ``empty_database``; its URL."""
    await migrate.upgrade(empty_database)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERAGENT_", "OPENAI_"))}
    port = free_port()
    env.update(
        {
            "DATABASE_URL": empty_database,
            "SUPERAGENT_STATE_DIR": str(tmp_path / "server-state"),
            "SUPERAGENT_HTTP__PORT": str(port),
            "SUPERAGENT_GRPC__PORT": str(free_port()),
        }
    )
    process = subprocess.Popen(  # noqa: ASYNC220 - started once; it runs beside the test
        [sys.executable, "-m", "controlplane.cli", "serve"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "serve.log").open("wb"),
    )
    url = f"http://127.0.0.1:{port}"

    async def healthy() -> bool:
        if process.poll() is not None:
            pytest.fail(
                f"serve exited {process.returncode}: {(tmp_path / 'serve.log').read_text()}"
            )
        try:
            async with httpx.AsyncClient() as client:
                return (await client.get(f"{url}/healthz", timeout=2)).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        await assert_eventually(healthy, timeout=90, interval=0.2, message="serve answers")
        yield url
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


async def test_the_admin_commands_work_over_http_as_the_tokens_holder(
    served: str, empty_database: str, tmp_path: Path
) -> None:
    pool = await asyncpg.create_pool(asyncpg_dsn(empty_database), min_size=1, max_size=2)
    try:
        # On the server: a ticket waiting for people, a paired device, and alice's token.
        waiting, _ = await ticket(pool, None, title="upgrade the ORM")
        await reports.finish(
            pool, waiting, None, {"status": "question", "summary": "s", "question": "which?"}
        )
        device = LocalDevice(pool, CommandDelivery(pool), tmp_path / "device")
        await device.pair()
        made = run_cli(empty_database, "tokens", "create", "alice")
        assert made.returncode == 0, made.stderr
        token = made.stdout.strip()
        assert token.startswith("sat_")
        assert token not in made.stderr

        laptop = Client(tmp_path / "laptop")
        # Nothing is reachable before login: the database is nowhere.
        assert laptop.run("tickets", "list").returncode != 0

        said = laptop.ok("login", served, "--name", "prod", stdin=token + "\n")
        assert "as alice" in said
        stored = laptop.home / ".config" / "superagent" / "contexts.json"
        assert stat.S_IMODE(stored.stat().st_mode) == 0o600
        assert stat.S_IMODE(stored.parent.stat().st_mode) == 0o700
        assert "prod" in laptop.ok("context", "list")

        listed = json.loads(laptop.ok("tickets", "list", "--json"))
        assert [t["id"] for t in listed] == [waiting]
        assert listed[0]["state"] == "waiting_human"
        assert waiting in laptop.ok("tickets", "show", waiting)
        transcript = laptop.ok("tickets", "show", waiting, "--transcript")
        assert "upgrade the ORM" in transcript
        assert "No rounds yet." in transcript
        unknown = laptop.run("tickets", "recall", waiting, "msg_000000000000")
        assert unknown.returncode == 1
        assert "Traceback" not in unknown.stderr

        laptop.ok("tickets", "retry", waiting, "--note", "the database is back")
        retried = await pool.fetchval(
            "SELECT text FROM worker_events WHERE ticket_id = $1 AND kind = 'retry'", waiting
        )
        assert retried.startswith("alice asks you to try again"), retried  # the token's name

        code = json.loads(laptop.ok("devices", "pair", "--name", "bob-desktop", "--json"))
        assert code["device_name"] == "bob-desktop"
        assert code["command"].startswith("endpointd pair ")
        issued_by = await pool.fetchval(
            "SELECT created_by FROM pairing_codes WHERE device_name = 'bob-desktop'"
        )
        assert issued_by == "alice"

        shared = json.loads(
            laptop.ok("devices", "share", device.name, "--with", "github:4242", "--json")
        )
        assert shared["shares"] == ["github:4242"]
        by = await pool.fetchval(
            "SELECT created_by FROM device_shares WHERE device_id = $1", device.id
        )
        assert by == "alice"
        assert "github:4242" in laptop.ok("devices", "show", device.name)
        unshared = laptop.ok("devices", "unshare", device.name, "--with", "github:4242")
        assert "shared with nobody else" in unshared
        names = [d["name"] for d in json.loads(laptop.ok("devices", "list", "--json"))]
        assert device.name in names
        assert "revoked" in laptop.ok("devices", "revoke", device.name)
        assert await pool.fetchval("SELECT revoked_at FROM devices WHERE id = $1", device.id)

        status = json.loads(laptop.ok("status", "--json"))
        assert len(status["replicas"]) == 1  # the serve replica, as its database says
        assert status["shell"] is None  # this shell's settings name no deployment
        assert "this shell:" not in laptop.ok("status")
        # Who pauses is the token's holder; a --by anyone could type is not taken.
        paused = json.loads(
            laptop.ok("pause", "--reason", "deploying", "--by", "mallory", "--json")
        )
        assert (paused["by"], paused["reason"]) == ("alice", "deploying")
        assert "PAUSED" in laptop.ok("status")
        assert "by alice" in laptop.ok("resume")

        # The router's inbox and the outbox, over the same API (admin operations).
        asked = await pool.fetchval("SELECT id FROM triggers ORDER BY created_at LIMIT 1")
        await pool.execute(
            "UPDATE triggers SET routed_at = now(), undecidable_at = now(), route_attempts = 3, "
            "route_error = 'malformed: nothing decided' WHERE id = $1",
            asked,
        )
        waiting = json.loads(laptop.ok("triggers", "list", "--undecidable", "--json"))
        assert [t["id"] for t in waiting] == [asked]
        assert "malformed: nothing decided" in laptop.ok("triggers", "show", asked)
        assert "back in the router's inbox" in laptop.ok("triggers", "retry", asked)
        assert (
            await pool.fetchval("SELECT undecidable_at FROM triggers WHERE id = $1", asked) is None
        )
        assert isinstance(json.loads(laptop.ok("effects", "list", "--json")), list)
        odd = laptop.run("triggers", "show", "not-an-id")
        assert odd.returncode == 1
        assert "is not a trigger id" in odd.stderr

        # People, linked by the deployment (which looks handles up with its own keys).
        linked = json.loads(laptop.ok("users", "link", "bob", "web:admin", "--json"))
        assert linked == {"person": "bob", "linked": ["web:admin"]}
        assert json.loads(laptop.ok("users", "list", "--json")) == {"bob": ["web:admin"]}
        assert "removed bob" in laptop.ok("users", "remove", "bob")

        # Who may ask, and the prompts: versions saved by the token's holder, whatever
        # --author says; the policy's handles are the deployment's to resolve.
        policy = json.loads(laptop.ok("admission", "show", "--json"))
        assert policy["default"] is True
        prompt = laptop.home / "router.md"
        prompt.write_text("You are the router. Be brief.\n")
        saved = json.loads(
            laptop.ok(
                "prompts", "edit", "router", "--file", str(prompt), "--author", "mallory", "--json"
            )
        )
        assert saved["version"] == 1
        author = await pool.fetchval(
            "SELECT author FROM prompt_versions WHERE id = $1", saved["id"]
        )
        assert author == "alice"
        assert laptop.ok("prompts", "show", "router") == "You are the router. Be brief.\n"
        stale = laptop.run(
            "prompts", "edit", "router", "--file", str(prompt), "--base", "prm_000000000000"
        )
        assert stale.returncode == 1
        assert "nothing saved; your text is in" in stale.stderr

        # `--context local` is the database: here, nowhere.
        local = laptop.run("--context", "local", "tickets", "list")
        assert local.returncode == 1
        assert "database unavailable" in local.stderr

        # Revoked on the server, the token opens nothing from the next request on.
        assert run_cli(empty_database, "tokens", "revoke", "alice").returncode == 0
        gone = laptop.run("tickets", "list")
        assert gone.returncode == 1
        assert "refused the token of context prod" in gone.stderr
        assert token not in gone.stderr + gone.stdout
    finally:
        await pool.close()


async def test_login_refuses_a_wrong_token_and_stores_nothing(served: str, tmp_path: Path) -> None:
    laptop = Client(tmp_path / "laptop")
    refused = laptop.run("login", served, stdin="sat_not-a-token\n")
    assert refused.returncode == 1
    assert "neither the admin token nor a live API token" in refused.stderr
    assert not (laptop.home / ".config" / "superagent" / "contexts.json").exists()
    unreachable = laptop.run("login", "http://127.0.0.1:9", stdin="sat_x\n")
    assert unreachable.returncode == 1
    assert "cannot reach http://127.0.0.1:9" in unreachable.stderr


def test_a_contexts_file_others_can_read_is_refused(tmp_path: Path) -> None:
    laptop = Client(tmp_path / "laptop")
    stored = laptop.home / ".config" / "superagent" / "contexts.json"
    stored.parent.mkdir(parents=True)
    stored.write_text('{"current": "prod", "contexts": {"prod": {"url": "x", "token": "t"}}}')
    stored.chmod(0o644)
    refused = laptop.run("tickets", "list")
    assert refused.returncode == 1
    assert "readable by other users" in refused.stderr


async def test_an_operation_refuses_what_it_does_not_know(served: str, empty_database: str) -> None:
    """The operations' endpoint: an unknown parameter or operation is a clear 4xx, never a
    500 or a guess; without a token, nothing."""
    made = run_cli(empty_database, "tokens", "create", "ops-probe")
    token = made.stdout.strip()
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=served, headers=headers, timeout=30) as client:
        typo = await client.post("/console/api/ops/triggers.list", json={"undecidabel": True})
        assert typo.status_code == 400
        assert "undecidabel" in typo.json()["error"]["message"]
        unknown = await client.post("/console/api/ops/tickets.delete_all", json={})
        assert unknown.status_code == 404
        bad = await client.post("/console/api/ops/triggers.list", json={"limit": -1})
        assert bad.status_code == 400
        done = await client.post("/console/api/ops/triggers.list", json={})
        assert done.status_code == 200
        assert done.json() == {"result": []}
    async with httpx.AsyncClient(base_url=served, timeout=30) as anonymous:
        refused = await anonymous.post("/console/api/ops/triggers.list", json={})
        assert refused.status_code == 401


def test_a_timeline_read_over_http_is_the_one_written() -> None:
    """`tickets show --transcript` over a context renders the timeline the deployment sent:
    its JSON read back is the same timeline, every field."""
    at = datetime(2026, 12, 8, 1, 2, 3, tzinfo=UTC)
    call = timeline.Entry(
        "call",
        "worker",
        '{"command": "ls"}',
        "msg_aaaaaaaaaaaa",
        at,
        tool="shell",
        call_id="c1",
        pending=True,
        form="fenced",
    )
    said = timeline.Entry("said", "worker", "done", "msg_bbbbbbbbbbbb", at, more="3 more lines")
    result = timeline.Entry(
        "result", "shell", "boom", "msg_cccccccccccc", at, tool="shell", call_id="c1", error=True
    )
    rounds = (
        timeline.Round(
            "asg_aaaaaaaaaaaa", 1, "new", "regular", "ready", 3, at, at, (call, result, said)
        ),
        timeline.Round("asg_bbbbbbbbbbbb", 2, "event", "regular", None, 0, at, None),
        timeline.Round("asg_cccccccccccc", 3, "event", "regular", None, 1, at, at),
    )
    written = timeline.Timeline("tkt_aaaaaaaaaaaa", "fix it", "running", rounds, earlier=4)
    assert timeline.Timeline.from_json(json.loads(json.dumps(written.as_json()))) == written


def test_a_command_that_only_knows_the_database_refuses_a_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The safety net for a command added later without an HTTP path: with a context
    chosen, it says so in one line instead of opening whatever database this shell names."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.setenv("SUPERAGENT_CONTEXT", "prod")
    contexts.save(contexts.Context("prod", "https://agent.example.com", "sat_x"))

    @click.command(name="newthing")
    def newthing() -> None:
        dbsession.run_with_pool(Settings(), lambda pool: pool.fetchval("SELECT 1"))

    with pytest.raises(SystemExit) as exited:
        newthing.main([], prog_name="superagent", standalone_mode=False)
    assert exited.value.code == 1
    said = capsys.readouterr().err
    assert "works on the database only, not yet over a context's HTTP API (context prod)" in said
    assert "--context local" in said
