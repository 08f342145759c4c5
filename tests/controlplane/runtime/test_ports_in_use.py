"""A replica whose port is taken says so and exits 1: not a crash, not a hang, not a stack
trace. (A test once handed the same free port to HTTP and to gRPC: the gateway bound it,
uvicorn called ``sys.exit`` from inside the event loop, and the replica died of SIGSEGV.)"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane.db import migrate
from tests.support.helpers import free_port

pytestmark = pytest.mark.slow


@pytest.fixture
async def env(empty_database: str, tmp_path: Path) -> dict[str, str]:
    await migrate.upgrade(empty_database)
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERAGENT_", "OPENAI_"))}
    environ.update(
        {
            "DATABASE_URL": empty_database,
            "SUPERAGENT_STATE_DIR": str(tmp_path / "state"),
            "SUPERAGENT_HTTP__PORT": str(free_port()),
            "SUPERAGENT_GRPC__PORT": str(free_port()),
            "SUPERAGENT_SHUTDOWN_TIMEOUT_SECONDS": "4",
        }
    )
    return environ


@pytest.fixture
def taken() -> Iterator[int]:
    """A port another program listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def _serve(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controlplane.cli", "serve"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("setting", ["SUPERAGENT_HTTP__PORT", "SUPERAGENT_GRPC__PORT"])
def test_a_taken_port_is_named_and_the_replica_exits_1(
    env: dict[str, str], taken: int, setting: str
) -> None:
    env[setting] = str(taken)
    result = _serve(env)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    assert f"port {taken} is in use" in output, output[-3000:]
    assert setting in output, output[-3000:]
    assert "Traceback" not in output, output[-3000:]


def test_one_port_for_http_and_grpc_is_refused_before_anything_starts(
    env: dict[str, str],
) -> None:
    port = free_port()
    env["SUPERAGENT_HTTP__PORT"] = env["SUPERAGENT_GRPC__PORT"] = str(port)
    result = _serve(env)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    assert f"both set to port {port}" in output, output[-3000:]
    assert "SUPERAGENT_HTTP__PORT" in output, output[-3000:]
    assert "SUPERAGENT_GRPC__PORT" in output, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    # Refused while reading the settings: nothing was started, so nothing had to be stopped.
    assert "device gateway listening" not in output, output[-3000:]
