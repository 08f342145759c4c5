"""The ``superagent`` command as users run it: real processes, real ports, real Postgres."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
import psutil
import pytest

from superagent_proto.v1 import endpoint_pb2, endpoint_pb2_grpc
from tests.support.helpers import free_port

SUPERAGENT = [sys.executable, "-m", "controlplane.cli"]


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SUPERAGENT, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERAGENT_", "OPENAI_"))}
    env.pop("DATABASE_URL", None)
    env.update(extra)
    return env


def test_help_lists_commands() -> None:
    result = run_cli("--help")
    assert result.returncode == 0
    for command in ("up", "serve", "migrate", "config"):
        assert f"  {command} " in result.stdout


def test_serve_refuses_an_unmigrated_database_then_migrate_fixes_it(
    empty_database: str, tmp_path: Path
) -> None:
    env = clean_env(DATABASE_URL=empty_database, SUPERAGENT_STATE_DIR=str(tmp_path))
    refused = run_cli("serve", "--http-port", str(free_port()), env=env)
    assert refused.returncode == 1
    assert "run `superagent migrate`" in refused.stderr
    assert "Traceback" not in refused.stderr

    check = run_cli("migrate", "--check", env=env)
    assert check.returncode == 1
    assert "superagent migrate" in check.stderr

    migrated = run_cli("migrate", env=env)
    assert migrated.returncode == 0, migrated.stderr
    assert "schema upgraded: empty →" in migrated.stdout
    again = run_cli("migrate", env=env)
    assert "already current" in again.stdout
    assert run_cli("migrate", "--check", env=env).returncode == 0


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("mysql://root@localhost/db", "must point at Postgres"),
        ("not a url at all", "not a valid URL"),
        ("postgresql://nobody:hunter2-canary@127.0.0.1:1/none", "database unavailable"),
    ],
)
def test_bad_database_url_gets_one_clear_line(url: str, expected: str, tmp_path: Path) -> None:
    result = run_cli("migrate", env=clean_env(DATABASE_URL=url, SUPERAGENT_STATE_DIR=str(tmp_path)))
    assert result.returncode == 1
    assert expected in result.stderr
    assert "Traceback" not in result.stderr
    assert "hunter2-canary" not in result.stderr + result.stdout


def test_production_refuses_placeholder_secrets(tmp_path: Path) -> None:
    result = run_cli(
        "config",
        env=clean_env(SUPERAGENT_ENVIRONMENT="production", SUPERAGENT_ADMIN_TOKEN="changeme"),
    )
    assert result.returncode == 1
    assert "placeholder" in result.stderr
    assert "Traceback" not in result.stderr


def test_config_masks_secrets() -> None:
    result = run_cli(
        "config",
        "--json",
        env=clean_env(
            OPENAI_API_KEY="sk-canary-0451",
            DATABASE_URL="postgresql://u:pw-canary-0451@db.example/x",
        ),
    )
    assert result.returncode == 0, result.stderr
    assert "canary-0451" not in result.stdout
    assert "db.example" in result.stdout


def test_config_says_where_each_value_comes_from(tmp_path: Path) -> None:
    token = tmp_path / "admin-token"
    token.write_text("t-canary-0452-" + "z" * 40 + "\n")
    result = run_cli(
        "config",
        env=clean_env(
            SUPERAGENT_ADMIN_TOKEN_FILE=str(token),
            SUPERAGENT_EFFECTS__CONCURRENCY="7",
            DATABASE_URL="postgresql://u:pw-canary-0452@db.example/x",
        ),
    )
    assert result.returncode == 0, result.stderr
    assert "canary-0452" not in result.stdout
    lines = {line.split()[0]: line.split(maxsplit=1)[1] for line in result.stdout.splitlines()}
    assert lines["SUPERAGENT_EFFECTS__CONCURRENCY"] == "7  (SUPERAGENT_EFFECTS__CONCURRENCY)"
    assert lines["SUPERAGENT_ADMIN_TOKEN"] == "**********  (SUPERAGENT_ADMIN_TOKEN_FILE)"
    assert lines["DATABASE_URL"] == "postgresql://u:***@db.example/x  (DATABASE_URL)"
    assert lines["SUPERAGENT_HTTP__HOST"] == "127.0.0.1  (default)"
    assert lines["OPENAI_API_KEY"] == "unset  (default)"


def _postgres_running_in(data_dir: Path) -> bool:
    for proc in psutil.process_iter(["name", "cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if proc.info.get("name") == "postgres" and str(data_dir) in " ".join(cmdline):
            return True
    return False


@pytest.mark.slow
def test_up_serves_on_embedded_postgres_and_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    http_port, grpc_port = free_port(), free_port()
    state = tmp_path / "state"
    proc = subprocess.Popen(
        [
            *SUPERAGENT,
            "up",
            "--state-dir",
            str(state),
            "--http-port",
            str(http_port),
            "--grpc-port",
            str(grpc_port),
        ],
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{http_port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.communicate()[1]
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "superagent up never served /healthz"
            time.sleep(0.1)

        assert httpx.get(f"{base}/healthz").json()["status"] == "ok"
        ready = httpx.get(f"{base}/readyz")
        assert ready.status_code == 200
        assert ready.json()["status"] == "ready"
        console = httpx.get(f"{base}/", follow_redirects=True)
        assert console.url.path == "/console"
        assert console.status_code == 401  # the sign-in form: nothing is open without the token
        # No token was configured: `up` generated one, for this user's eyes only.
        token = (state / "admin-token").read_text().strip()
        assert (state / "admin-token").stat().st_mode & 0o077 == 0
        bearer = {"Authorization": f"Bearer {token}"}
        overview = httpx.get(f"{base}/console/api/overview", headers=bearer)
        assert "No model is set" in overview.text
        openapi = httpx.get(f"{base}/openapi.json", headers=bearer).json()
        assert "/healthz" in openapi["paths"]
        assert httpx.get(f"{base}/no-such-page", headers=bearer).status_code == 404
        assert (state / "postgres" / "PG_VERSION").exists()

        # The gateway serves TLS from the CA it created in the state directory.
        ca = (state / "tls" / "ca.pem").read_bytes()
        credentials = grpc.ssl_channel_credentials(root_certificates=ca)
        options = [("grpc.ssl_target_name_override", "superagent-gateway")]
        with grpc.secure_channel(f"127.0.0.1:{grpc_port}", credentials, options) as channel:
            stub = endpoint_pb2_grpc.EndpointGatewayStub(channel)
            request = endpoint_pb2.PairRequest(pairing_code="nope", public_key=b"k" * 32)
            with pytest.raises(grpc.RpcError) as err:
                stub.Pair(request, timeout=5)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "not a pairing code" in (err.value.details() or "")

        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=15)
        elapsed = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    assert elapsed < 5, f"Ctrl-C took {elapsed:.1f}s"
    assert "Traceback" not in stderr
    # One "stopping" line (its watchdog child, stopped by `up`, says nothing), and a clean
    # stop warns of nothing: it once said "stopping" twice and cancelled the child.
    tail = stderr[stderr.index("stopping (Ctrl-C again to force)") :]
    assert tail.count("stopping") == 1, tail
    assert not [line for line in tail.splitlines() if " WARNING " in line], tail
    assert not _postgres_running_in(state / "postgres"), "embedded Postgres left running"
