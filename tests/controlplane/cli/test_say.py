"""`superagent say "/run DEVICE COMMAND"` as a new user runs it: a real `superagent serve`
(rules-only, no model), a real endpointd paired over TLS gRPC, and `say` as a process. The
command's output must reach the terminal before `say` exits."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.gateway.tls import gateway_tls
from controlplane.identities import WEB_ADMIN
from controlplane.ingest.admission import Admission
from controlplane.settings import Settings
from tests.support.daemon import Daemon, daemon_beside
from tests.support.gateway_harness import pairing_code
from tests.support.helpers import assert_eventually, free_port, save_policy
from tests.support.replica_process import ReplicaProcess

pytestmark = pytest.mark.slow


@pytest.fixture
def replica(database_url: str, tmp_path: Path) -> Iterator[ReplicaProcess]:
    """`superagent serve` with no model, its own state dir (and generated admin token)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SUPERAGENT_", "OPENAI_")) and k != "DATABASE_URL"
    }
    env |= {
        "DATABASE_URL": database_url,
        "SUPERAGENT_STATE_DIR": str(tmp_path / "cp"),
        "SUPERAGENT_HTTP__PORT": str(free_port()),
        "SUPERAGENT_GRPC__PORT": str(free_port()),
        "SUPERAGENT_ROUTER__LEASE_SECONDS": "3",
        "SUPERAGENT_ROUTER__RENEW_SECONDS": "1",
    }
    process = ReplicaProcess(env, tmp_path / "replica.log", int(env["SUPERAGENT_HTTP__PORT"]))
    # The gateway's certificate, made now so that endpointd can pin its fingerprint.
    gateway_tls(Settings(state_dir=tmp_path / "cp"))
    process.start()
    yield process
    process.stop()


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with daemon_beside(tmp_path) as instance:
        yield instance


async def say(replica: ReplicaProcess, *args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERAGENT_", "OPENAI_"))}
    # No token in the environment: `say` reads the one the replica generated.
    env["SUPERAGENT_STATE_DIR"] = replica.env["SUPERAGENT_STATE_DIR"]
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "controlplane.cli", "say", "--url", replica.url, *args),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        async with asyncio.timeout(120):
            out, err = await process.communicate()
    except TimeoutError:
        process.kill()
        out, err = await process.communicate()
        raise AssertionError(f"say hung; stdout {out!r}, stderr {err!r}") from None
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_say_run_prints_the_commands_output_before_it_exits(
    replica: ReplicaProcess,
    daemon: Daemon,
    pool: asyncpg.Pool,
    db: async_sessionmaker[AsyncSession],
) -> None:
    await save_policy(db, Admission())  # out of the box: the console's chat is allowlisted
    await assert_eventually(replica.up, timeout=60, interval=0.2, message="replica up")
    # The admin's own device, as `superagent up --device` pairs it.
    pairing = await pairing_code(db, "laptop", owner=WEB_ADMIN)
    tls = gateway_tls(Settings(state_dir=Path(replica.env["SUPERAGENT_STATE_DIR"])))
    assert tls is not None
    port = replica.env["SUPERAGENT_GRPC__PORT"]
    paired = await daemon.pair(
        f"https://127.0.0.1:{port}", pairing, "--fingerprint", tls.fingerprint
    )
    assert paired.returncode == 0, paired.stdout + paired.stderr
    daemon.start()
    await daemon.wait_connected()

    code, out, err = await say(replica, "/run laptop echo hi-from-the-device")
    assert code == 0, (out, err, replica.log.read_text(errors="replace")[-3000:])
    lines = out.splitlines()
    assert lines[0] == "Running on laptop: echo hi-from-the-device (the result follows here)"
    assert "hi-from-the-device" in lines[1:], out
    assert "exit 0" in out
    # stdout is exactly the replies on the conversation; the id is on stderr, on its own line.
    sent = await pool.fetch(
        "SELECT s.text FROM sent_messages s JOIN threads t ON t.id = s.thread_id "
        "WHERE t.source = 'web' ORDER BY s.sent_at"
    )
    assert out == "".join(row["text"].rstrip("\n") + "\n" for row in sent)
    assert any(line.startswith("conversation chat_") for line in err.splitlines()), err
    assert "Traceback" not in err

    # A /run to a device that does not exist: the reply says so, and so does the exit
    # status (it once exited 0, as if the command had run).
    code, out, err = await say(replica, "/run nowhere echo hi")
    assert code == 1, (out, err)
    assert "no paired device 'nowhere'" in out
    assert err.splitlines()[-1].startswith("error: /run failed: no paired device 'nowhere'"), err
