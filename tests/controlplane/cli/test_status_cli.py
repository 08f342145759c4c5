"""``superagent status`` describes the deployment, not the shell it is typed in.

A newcomer starts ``superagent serve`` with a model in one shell and types ``superagent
status`` in another, where no model is set: status must name the running replicas' model
(from what each replica recorded with its heartbeat), and never a secret of theirs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from controlplane import heartbeat
from tests.support.helpers import assert_eventually, free_port
from tests.support.replica_process import ReplicaProcess

CANARY = "canary-7f3a9c1e5d"
NO_REPLICA = "no replica is running: start one with `superagent up` or check your deployment"


def _shell_env(database_url: str, **extra: str) -> dict[str, str]:
    """The environment of a shell that knows the database and nothing about any model."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OPENAI_", "SUPERAGENT_OPENAI_", "SUPERAGENT_LLM__"))
    }
    return {**env, "DATABASE_URL": database_url, **extra}


def _status(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controlplane.cli", "status", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[list[ReplicaProcess]]:
    started: list[ReplicaProcess] = []
    yield started
    for replica in started:
        replica.stop()


def _start(
    started: list[ReplicaProcess], database_url: str, tmp_path: Path, **env: str
) -> ReplicaProcess:
    replica = ReplicaProcess(
        env=_shell_env(
            database_url,
            SUPERAGENT_STATE_DIR=str(tmp_path / "state"),
            SUPERAGENT_HTTP__PORT=str(free_port()),
            SUPERAGENT_GRPC__PORT=str(free_port()),
            **env,
        ),
        log=tmp_path / "serve.log",
    )
    replica.start()
    started.append(replica)
    return replica


async def _alive_row(pool: asyncpg.Pool, replica: ReplicaProcess) -> asyncpg.Record:
    async def row() -> asyncpg.Record | None:
        assert replica.alive(), replica.log.read_text()[-3000:]
        return await pool.fetchrow("SELECT * FROM replicas WHERE stopped_at IS NULL")

    found = await assert_eventually(row, timeout=60, interval=0.2, message="no heartbeat")
    assert isinstance(found, asyncpg.Record)
    return found


async def test_status_names_the_deployments_model_not_the_shells(
    pool: asyncpg.Pool, database_url: str, tmp_path: Path, serve: list[ReplicaProcess]
) -> None:
    replica = _start(
        serve,
        database_url,
        tmp_path,
        OPENAI_BASE_URL="http://127.0.0.1:9/v1",
        OPENAI_API_KEY="sk-test",
        SUPERAGENT_LLM__ROUTER_MODEL="router-of-the-deployment",
        SUPERAGENT_LLM__WORKER_MODEL="worker-of-the-deployment",
    )
    await _alive_row(pool, replica)

    shown = _status(_shell_env(database_url))
    assert shown.returncode == 0, shown.stderr
    model = next(line for line in shown.stdout.splitlines() if line.startswith("model:"))
    assert "router-of-the-deployment" in model, shown.stdout
    assert "rules-only" not in model
    assert "127.0.0.1" in model  # the endpoint's host
    # The shell's own view is there, labelled as the shell's, not the deployment's.
    shell = next(line for line in shown.stdout.splitlines() if line.startswith("this shell:"))
    assert "none (rules-only mode)" in shell

    as_json = json.loads(_status(_shell_env(database_url), "--json").stdout)
    assert as_json["model"].startswith("router-of-the-deployment")
    [alive] = as_json["replicas"]
    assert replica.process is not None
    assert alive["pid"] == replica.process.pid
    assert alive["runs_with"]["worker_model"] == "worker-of-the-deployment"
    assert alive["leader"] in (True, False)
    assert as_json["shell"]["model"] == "none (rules-only mode)"


async def test_no_secret_of_a_replica_reaches_its_record_or_status(
    pool: asyncpg.Pool, database_url: str, tmp_path: Path, serve: list[ReplicaProcess]
) -> None:
    """The attacker's view: whoever can read the replicas table (or run status) learns no
    key, token or password the replica was started with."""
    secrets = {
        "OPENAI_API_KEY": CANARY,
        # Credentials in a URL's user-info and query: only the host may be recorded.
        "OPENAI_BASE_URL": f"http://agent:{CANARY}@127.0.0.1:9/v1?api-key={CANARY}",
        "SUPERAGENT_ADMIN_TOKEN": CANARY,
        "SUPERAGENT_GITHUB__WEBHOOK_SECRET": CANARY,
        "SUPERAGENT_GITHUB__TOKEN": CANARY,
        "SUPERAGENT_SLACK__BOT_TOKEN": f"xoxb-{CANARY}",
        "SUPERAGENT_SLACK__SIGNING_SECRET": CANARY,
        "SUPERAGENT_SLACK__API_URL": "http://127.0.0.1:9/api",
        "SUPERAGENT_LARK__APP_ID": "cli_status_test",
        "SUPERAGENT_LARK__APP_SECRET": CANARY,
        "SUPERAGENT_LARK__VERIFICATION_TOKEN": CANARY,
        "SUPERAGENT_LARK__ENCRYPT_KEY": CANARY,
        "SUPERAGENT_LARK__DOMAIN": "http://127.0.0.1:9",
    }
    replica = _start(serve, database_url, tmp_path, **secrets)
    await _alive_row(pool, replica)

    rows = await pool.fetch("SELECT to_jsonb(r)::text AS row FROM replicas r")
    dumped = "\n".join(row["row"] for row in rows)
    # The record is there (so the check below looks at something) ...
    for recorded in ("127.0.0.1", "slack", "lark", "github"):
        assert recorded in dumped, dumped
    # ... and holds none of the secrets.
    assert CANARY not in dumped, dumped

    # Status run in the same shell (its environment holds the canary too) prints none.
    for args in ((), ("--json",)):
        shown = _status(_shell_env(database_url, **secrets), *args)
        assert shown.returncode == 0, shown.stderr
        assert "127.0.0.1" in shown.stdout
        assert CANARY not in shown.stdout + shown.stderr


async def test_a_silent_or_stopped_replica_is_not_alive(
    pool: asyncpg.Pool, database_url: str
) -> None:
    record = heartbeat.Record(
        version="0.0.9",
        router_model="old-model",
        worker_model="old-model",
        model_host="models.example",
        channels=("webchat",),
        hostname="box-1",
        pid=4242,
    )
    await heartbeat.beat(pool, "box-1:4242:aaaaaa", record)
    await heartbeat.beat(pool, "box-2:4343:bbbbbb", record)
    await pool.execute(
        "UPDATE replicas SET heartbeat_at = now() - interval '1 hour' WHERE id = $1",
        "box-1:4242:aaaaaa",
    )
    await pool.execute("UPDATE replicas SET stopped_at = now() WHERE id = $1", "box-2:4343:bbbbbb")

    shown = _status(_shell_env(database_url))
    assert shown.returncode == 0, shown.stderr
    assert NO_REPLICA in shown.stdout
    # What the database still holds: the last replica seen, and no model claimed as live.
    assert "box-2:4343:bbbbbb" in shown.stdout
    model = next(line for line in shown.stdout.splitlines() if line.startswith("model:"))
    assert "no replica is running" in model
    as_json = json.loads(_status(_shell_env(database_url), "--json").stdout)
    assert as_json["replicas"] == []
    assert as_json["last_replica"]["id"] == "box-2:4343:bbbbbb"


async def test_no_replica_ever_gives_the_plain_line(pool: asyncpg.Pool, database_url: str) -> None:
    shown = _status(_shell_env(database_url))
    assert shown.returncode == 0, shown.stderr
    assert NO_REPLICA in shown.stdout


async def test_version_skew_between_alive_replicas_is_flagged(
    pool: asyncpg.Pool, database_url: str
) -> None:
    for version, pid in (("0.1.0", 10), ("0.2.0", 11)):
        record = heartbeat.Record(
            version=version,
            router_model=None,
            worker_model=None,
            model_host=None,
            channels=(),
            hostname="box",
            pid=pid,
        )
        await heartbeat.beat(pool, f"box:{pid}:cccccc", record)

    shown = _status(_shell_env(database_url))
    assert shown.returncode == 0, shown.stderr
    assert "version skew" in shown.stdout.lower()
    assert "box:10:cccccc" in shown.stdout
    assert "box:11:cccccc" in shown.stdout
    as_json = json.loads(_status(_shell_env(database_url), "--json").stdout)
    assert sorted(as_json["version_skew"]) == ["0.1.0", "0.2.0"]
    assert as_json["model"] == "none (rules-only mode)"


async def test_status_lists_findings_and_devices_capped(
    pool: asyncpg.Pool, database_url: str
) -> None:
    from controlplane import findings

    await findings.record(
        pool,
        "replica_silent",
        [
            findings.Seen("replica_silent", f"r{i}", "warning", f"replica r{i} went silent")
            for i in range(7)
        ],
    )
    await pool.execute(
        "INSERT INTO leases (name, holder, acquired_at, renewed_at, expires_at) "
        "VALUES ('watchdog', 'wd-host:99', now(), now(), now() + interval '1 minute')"
    )
    for i in range(13):
        await pool.execute(
            "INSERT INTO devices (id, name, last_seen_at, connected_replica) "
            "VALUES ($1, $2, now() - make_interval(mins => $3), $4)",
            f"dev_{i:012d}",
            f"laptop-{i:02d}",
            i,
            "r" if i == 0 else None,
        )

    shown = _status(_shell_env(database_url))
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "7 open" in out
    assert out.count("went silent") == 5  # the newest few, one line each
    assert "… and 2 more finding(s)" in out
    assert "1 online of 13 paired" in out
    assert next(line for line in out.splitlines() if "laptop-00" in line).split()[1] == "online"
    assert "… and 3 more device(s)" in out  # ten shown
    as_json = json.loads(_status(_shell_env(database_url), "--json").stdout)
    assert as_json["findings_open"] == 7
    assert [(d["name"], d["online"]) for d in as_json["devices"][:2]] == [
        ("laptop-00", True),
        ("laptop-01", False),
    ]
    assert len(as_json["devices"]) == 10
