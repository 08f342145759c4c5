"""What a real `superagent serve` writes to its log when things go wrong around it.

A peer speaking plain TCP or bad TLS to the device gateway leaves no gRPC C-core chatter; a
Postgres restart under a replica with a device connected is one "database unreachable" line
and one "database back" line, without a traceback; and `superagent up`'s log also goes to a
rotating file in its state directory.
"""

from __future__ import annotations

import asyncio
import logging
import logging.handlers
import os
import socket
import ssl
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

from controlplane import logs
from controlplane.db.urls import asyncpg_dsn
from controlplane.gateway import pairing
from controlplane.gateway.tls import gateway_tls
from controlplane.settings import Settings
from tests.e2e.test_db_outage import OwnPostgres, own_postgres  # noqa: F401 - fixture
from tests.support.daemon import Daemon, daemon_beside
from tests.support.database import asyncpg_transaction, with_database
from tests.support.helpers import assert_eventually, free_port
from tests.support.replica_process import ReplicaProcess, prepare_database

# What gRPC's C core prints for a failed TLS handshake (its file, and its words).
CHATTER = ("ssl_transport_security", "Handshake failed")


class Deployment:
    def __init__(self, replica: ReplicaProcess, database_url: str, grpc_port: int) -> None:
        self.replica = replica
        self.database_url = database_url
        self.grpc_port = grpc_port
        tls = gateway_tls(Settings(state_dir=Path(replica.env["SUPERAGENT_STATE_DIR"])))
        assert tls is not None
        self.fingerprint = tls.fingerprint

    def log(self) -> str:
        return self.replica.log.read_text(errors="replace")


@pytest.fixture
async def deployment(
    own_postgres: OwnPostgres,  # noqa: F811 - the imported fixture
    tmp_path: Path,
) -> AsyncIterator[Deployment]:
    admin = await asyncpg.connect(asyncpg_dsn(own_postgres.url))
    try:
        await admin.execute("CREATE DATABASE quiet")
    finally:
        await admin.close()
    url = with_database(own_postgres.url, "quiet")
    await prepare_database(url, [])
    http, grpc_port = free_port(), free_port()
    # The operator's environment, without settings of ours or gRPC's: the defaults are tested.
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("SUPERAGENT_", "OPENAI_", "GRPC_"))
    }
    env.update(
        {
            "DATABASE_URL": url,
            "SUPERAGENT_STATE_DIR": str(tmp_path / "state"),
            "SUPERAGENT_HTTP__PORT": str(http),
            "SUPERAGENT_GRPC__PORT": str(grpc_port),
        }
    )
    replica = ReplicaProcess(env, tmp_path / "serve.log", http)
    # The gateway's certificate first, so that the test knows its fingerprint.
    found = Deployment(replica, url, grpc_port)
    replica.start()
    try:
        await assert_eventually(replica.up, timeout=90, interval=0.2, message="replica up")
        yield found
    finally:
        replica.stop()


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with daemon_beside(tmp_path) as instance:
        yield instance


def _speak_badly(port: int) -> None:
    """Three peers that are not gRPC over TLS: plain HTTP, random bytes, and a TLS client
    that rejects the gateway's certificate. Each waits until the gateway hangs up."""
    for payload in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", os.urandom(512)):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as plain:
            plain.sendall(payload)
            while plain.recv(4096):  # until the gateway closes the connection
                pass
    strict = ssl.create_default_context()  # the system's roots: not the gateway's own CA
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        pytest.raises(ssl.SSLError),
    ):
        strict.wrap_socket(raw, server_hostname="localhost")


@pytest.mark.slow
async def test_bad_tls_to_the_gateway_leaves_no_grpc_chatter(deployment: Deployment) -> None:
    await asyncio.to_thread(_speak_badly, deployment.grpc_port)
    # The replica is still answering, and has had its say about those peers by now.
    assert await deployment.replica.up()
    log = deployment.log()
    for words in CHATTER:
        assert words not in log, log[-4000:]


@pytest.mark.slow
async def test_a_postgres_restart_under_a_connected_device_is_one_line_down_one_back(
    deployment: Deployment,
    own_postgres: OwnPostgres,  # noqa: F811 - the imported fixture
    daemon: Daemon,
) -> None:
    async with asyncpg_transaction(deployment.database_url) as conn:
        code = await pairing.create_code(
            conn, device_name="laptop", owner="tester", created_by="test"
        )
    paired = await daemon.pair(
        f"https://127.0.0.1:{deployment.grpc_port}",
        code.display,
        "--fingerprint",
        deployment.fingerprint,
    )
    assert paired.returncode == 0, paired.stdout + paired.stderr
    daemon.start()
    await daemon.wait_connected()

    await asyncio.to_thread(own_postgres.stop)
    await assert_eventually(
        lambda: "database unreachable" in deployment.log(), timeout=30, message="outage seen"
    )
    await asyncio.to_thread(own_postgres.start)
    await assert_eventually(
        lambda: "database back" in deployment.log(), timeout=30, message="recovery seen"
    )
    await assert_eventually(deployment.replica.up, timeout=30, interval=0.2)
    await daemon.wait_connected()

    log = deployment.log()
    assert "Traceback" not in log, log[-4000:]
    assert log.count("database unreachable") == 1, log[-4000:]
    assert log.count("database back") == 1, log[-4000:]


def test_up_also_logs_to_a_rotating_file_in_its_state_dir(tmp_path: Path) -> None:
    root = logging.getLogger()
    before = list(root.handlers)
    try:
        path = logs.log_to_file(tmp_path / "state")
        assert path == tmp_path / "state" / "logs" / "superagent.log"
        assert logs.log_to_file(tmp_path / "state") == path  # once, however often asked
        added = [h for h in root.handlers if h not in before]
        assert len(added) == 1
        handler = added[0]
        assert isinstance(handler, logging.handlers.RotatingFileHandler)
        assert (handler.maxBytes, handler.backupCount) == (10 * 1024 * 1024, 5)
        logging.getLogger("controlplane.test").warning("written to the file")
        handler.flush()
        assert "written to the file" in path.read_text()
        assert path.stat().st_mode & 0o777 == 0o600
        assert path.parent.stat().st_mode & 0o777 == 0o700
    finally:
        for handler in root.handlers[:]:
            if handler not in before:
                root.removeHandler(handler)
                handler.close()
