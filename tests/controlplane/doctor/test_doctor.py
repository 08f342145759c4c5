"""``superagent doctor``: every check against real parts, and the command as users run it."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from cryptography import x509

from controlplane import doctor
from controlplane.access import admin_token
from controlplane.gateway.tls import ensure_server_tls
from controlplane.settings import Settings
from tests.fakes.github_server import FakeGitHub
from tests.fakes.openai_server import FAKE_API_KEY, FAKE_MODEL, FakeOpenAIServer

ADMIN_TOKEN = "admin-token-canary-3141-5926-5358-9793"
WEBHOOK_SECRET = "webhook-secret-canary-2718"


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        assert isinstance(port, int)
        return port


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERAGENT_", "OPENAI_"))}
    env.pop("DATABASE_URL", None)
    return {**env, **extra}


def run_doctor(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controlplane.cli", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def lines_by_check(stdout: str) -> dict[str, str]:
    """Each check's line (with its fix line, if any) by the check's name."""
    found: dict[str, str] = {}
    current = ""
    for line in stdout.splitlines():
        if line[:2] in ("✓ ", "✗ "):
            current = line[2:].split("  ")[0].strip()
            found[current] = line
        elif line.strip().startswith("fix: "):
            found[current] += "\n" + line
    return found


@pytest.fixture
def healthy_env(
    database_url: str, fake_llm: FakeOpenAIServer, tmp_path: Path
) -> Iterator[dict[str, str]]:
    """A configuration whose every check passes: the test database, the fake model,
    GitHub with a token the fake accepts, and a gateway certificate in the state dir."""
    ensure_server_tls(tmp_path / "tls")
    with FakeGitHub() as github:
        yield clean_env(
            DATABASE_URL=database_url,
            SUPERAGENT_STATE_DIR=str(tmp_path),
            SUPERAGENT_ADMIN_TOKEN=ADMIN_TOKEN,
            OPENAI_BASE_URL=fake_llm.url,
            OPENAI_API_KEY=FAKE_API_KEY,
            SUPERAGENT_LLM__ROUTER_MODEL=FAKE_MODEL,
            SUPERAGENT_LLM__WORKER_MODEL=FAKE_MODEL,
            SUPERAGENT_GITHUB__TOKEN=github.pat,
            SUPERAGENT_GITHUB__WEBHOOK_SECRET=WEBHOOK_SECRET,
            SUPERAGENT_GITHUB__API_URL=github.url,
        )


def assert_no_secrets(env: dict[str, str], output: str) -> None:
    for name in ("SUPERAGENT_ADMIN_TOKEN", "OPENAI_API_KEY", "SUPERAGENT_GITHUB__TOKEN"):
        if name in env:
            assert env[name] not in output, name
    assert WEBHOOK_SECRET not in output


# --------------------------------------------------------------------------- the command


def test_a_healthy_setup_passes_every_check(healthy_env: dict[str, str]) -> None:
    result = run_doctor(healthy_env)
    assert result.returncode == 0, result.stdout + result.stderr
    checks = lines_by_check(result.stdout)
    assert list(checks) == [
        "configuration",
        "admin token",
        "http",
        "worker holds",
        "gateway certificate",
        "database",
        "identities",
        "github",
        "web chat",
        "model",
    ]
    assert all(line.startswith("✓ ") for line in checks.values()), result.stdout
    assert "production" not in checks["configuration"]
    assert "admin token set" in checks["configuration"]
    assert "schema current" in checks["database"]
    assert "fingerprint sha256:" in checks["gateway certificate"]
    assert "GitHub accepts the token" in checks["github"]
    assert f"serves {FAKE_MODEL}" in checks["model"]
    assert result.stdout.rstrip().endswith("all checks passed")
    assert_no_secrets(healthy_env, result.stdout + result.stderr)

    machine = run_doctor(healthy_env, "--json")
    assert machine.returncode == 0, machine.stderr
    report = json.loads(machine.stdout)
    assert report["ok"] is True
    assert [c["name"] for c in report["checks"]] == list(checks)
    assert all(c["ok"] and c["fix"] is None for c in report["checks"])
    assert_no_secrets(healthy_env, machine.stdout)


def test_an_unreachable_model_fails_with_its_fix(healthy_env: dict[str, str]) -> None:
    env = {**healthy_env, "OPENAI_BASE_URL": f"http://127.0.0.1:{closed_port()}/v1"}
    result = run_doctor(env)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    checks = lines_by_check(result.stdout)
    model = checks.pop("model")
    assert model.startswith("✗ model")
    assert "nothing answers at http://127.0.0.1:" in model
    assert "fix: check OPENAI_BASE_URL" in model
    # Only the model failed: the other checks still ran, and passed.
    assert all(line.startswith("✓ ") for line in checks.values()), result.stdout
    assert result.stdout.rstrip().endswith("1 of 10 checks failed")
    assert_no_secrets(env, result.stdout + result.stderr)

    report = json.loads(run_doctor(env, "--json").stdout)
    assert report["ok"] is False
    failed = [c for c in report["checks"] if not c["ok"]]
    assert [c["name"] for c in failed] == ["model"]
    assert "OPENAI_BASE_URL" in failed[0]["fix"]


def test_invalid_configuration_is_one_failed_check(tmp_path: Path) -> None:
    env = clean_env(SUPERAGENT_STATE_DIR=str(tmp_path), SUPERAGENT_ENVIRONMENT="production")
    result = run_doctor(env)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    checks = lines_by_check(result.stdout)
    assert list(checks) == ["configuration"]
    assert (
        "SUPERAGENT_ADMIN_TOKEN is required when environment=production" in checks["configuration"]
    )
    assert "fix: correct the variables named above" in checks["configuration"]


def test_without_a_model_rules_only_mode_is_a_pass(tmp_path: Path, database_url: str) -> None:
    env = clean_env(SUPERAGENT_STATE_DIR=str(tmp_path), DATABASE_URL=database_url)
    result = run_doctor(env)
    assert result.returncode == 0, result.stdout
    checks = lines_by_check(result.stdout)
    assert checks["model"].startswith("✓ model")
    assert "rules-only mode" in checks["model"]
    assert "not created yet" in checks["gateway certificate"]
    assert "github" not in checks  # not configured: nothing to check


# --------------------------------------------------------------------------- configuration


def test_listening_beyond_loopback_needs_the_admin_token(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("SUPERAGENT_", "OPENAI_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("SUPERAGENT_HTTP__HOST", "0.0.0.0")  # noqa: S104 - the point
    check, settings = doctor.check_configuration()
    assert settings is not None
    assert not check.ok
    assert "SUPERAGENT_ADMIN_TOKEN" in (check.fix or "")
    monkeypatch.setenv("SUPERAGENT_ADMIN_TOKEN", ADMIN_TOKEN)
    check, _ = doctor.check_configuration()
    assert check.ok
    assert ADMIN_TOKEN not in check.detail


# --------------------------------------------------------------------------- database


async def test_database_checks(database_url: str, empty_database: str) -> None:
    current = await doctor.check_database(database_url)
    assert current.ok, current
    empty = await doctor.check_database(empty_database)
    assert not empty.ok
    assert "empty (no schema)" in empty.detail
    assert empty.fix is not None
    assert "superagent migrate" in empty.fix
    url = f"postgresql://someone:pw-canary-99@127.0.0.1:{closed_port()}/nothing"
    down = await doctor.check_database(url)
    assert not down.ok
    assert "unavailable" in down.detail
    assert down.fix is not None
    assert "DATABASE_URL" in down.fix
    assert "pw-canary-99" not in down.detail + down.fix
    bad = await doctor.check_database("mysql://root@localhost/db")
    assert not bad.ok
    assert "must point at Postgres" in bad.detail


# --------------------------------------------------------------------------- gateway TLS


def test_gateway_certificate_checks(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path)
    tls = tmp_path / "tls"
    assert "not created yet" in doctor.check_gateway_tls(settings).detail
    assert doctor.check_gateway_tls(Settings(state_dir=tmp_path, grpc={"tls": "off"})).ok

    made = ensure_server_tls(tls)
    fresh = doctor.check_gateway_tls(settings)
    assert fresh.ok, fresh
    assert made.fingerprint in fresh.detail
    expires = x509.load_pem_x509_certificate((tls / "server.pem").read_bytes()).not_valid_after_utc
    soon = doctor.check_gateway_tls(settings, now=expires - dt.timedelta(days=3))
    assert soon.ok
    assert "restart before then" in soon.detail
    expired = doctor.check_gateway_tls(settings, now=expires + dt.timedelta(days=1))
    assert not expired.ok
    assert "expired" in expired.detail
    assert expired.fix is not None
    assert "renews the certificate on start" in expired.fix
    ca_gone = doctor.check_gateway_tls(settings, now=expires + dt.timedelta(days=3650))
    assert not ca_gone.ok
    assert "CA expired" in ca_gone.detail

    (tls / "server.key").chmod(0o644)
    loose = doctor.check_gateway_tls(settings)
    assert not loose.ok
    assert loose.fix == f"chmod 600 {tls / 'server.key'}"
    (tls / "server.key").chmod(0o600)

    # A certificate from another CA (say, copied from another machine).
    ensure_server_tls(tmp_path / "other")
    (tls / "server.pem").write_bytes((tmp_path / "other" / "server.pem").read_bytes())
    foreign = doctor.check_gateway_tls(settings)
    assert not foreign.ok
    assert "not issued by the CA" in foreign.detail
    (tls / "server.pem").write_text("not a certificate")
    assert "not a readable certificate" in doctor.check_gateway_tls(settings).detail

    (tls / "ca.key").unlink()
    no_key = doctor.check_gateway_tls(settings)
    assert not no_key.ok
    assert "pair again" in no_key.detail
    assert no_key.fix is not None
    assert "restore ca.key" in no_key.fix


# --------------------------------------------------------------------------- channels


async def test_github_checks_ask_github() -> None:
    with FakeGitHub() as github:
        base = {"api_url": github.url, "webhook_secret": WEBHOOK_SECRET}
        async with httpx.AsyncClient(timeout=doctor.TIMEOUT) as http:
            good = await doctor.check_github(Settings(github={**base, "token": github.pat}), http)
            revoked = await doctor.check_github(
                Settings(github={**base, "token": "ghp_revoked"}), http
            )
            wrong_app = await doctor.check_github(
                Settings(
                    github={
                        **base,
                        "app_id": github.app_id,
                        "private_key": FakeGitHub().private_key_pem,  # another App's key
                    }
                ),
                http,
            )
    assert good.ok, good
    assert "events by webhooks" in good.detail
    assert not revoked.ok
    assert "GitHub refuses the token (401)" in revoked.detail
    assert revoked.fix is not None
    assert "SUPERAGENT_GITHUB__TOKEN" in revoked.fix
    assert not wrong_app.ok
    assert "refuses the GitHub App 4242" in wrong_app.detail
    assert wrong_app.fix is not None
    assert "clock" in wrong_app.fix
    for check in (good, revoked, wrong_app):
        assert github.pat not in check.detail + (check.fix or "")


async def test_channels_that_cannot_hear_anything_fail() -> None:
    settings = Settings(
        github={"webhook_secret": WEBHOOK_SECRET},
        slack={"bot_token": "xoxb-canary-1"},
        matrix={
            "homeserver": "https://matrix.example.org",
            "user_id": "@agent:example.org",
            "password": "pw-canary-2",
        },
        lark={"app_id": "cli_1", "app_secret": "lark-canary-3"},
        webchat={"enabled": False},
    )
    async with httpx.AsyncClient(timeout=doctor.TIMEOUT) as http:
        checks = {c.name: c for c in await doctor.check_channels(settings, http)}
    assert list(checks) == ["github", "slack", "matrix", "lark", "web chat"]
    assert not checks["github"].ok
    assert "SUPERAGENT_GITHUB__TOKEN" in (checks["github"].fix or "")
    assert not checks["slack"].ok
    assert "SUPERAGENT_SLACK__APP_TOKEN" in (checks["slack"].fix or "")
    assert checks["matrix"].ok
    assert "password set" in checks["matrix"].detail
    assert not checks["lark"].ok
    assert "LONG_CONNECTION" in (checks["lark"].fix or "")
    assert checks["web chat"].ok
    assert "off" in checks["web chat"].detail
    text = " ".join(c.detail + (c.fix or "") for c in checks.values())
    for secret in ("xoxb-canary-1", "pw-canary-2", "lark-canary-3", WEBHOOK_SECRET):
        assert secret not in text


# --------------------------------------------------------------------------- model


async def test_model_checks() -> None:
    with FakeOpenAIServer(models=("router-m", "worker-m")) as server:
        llm = {"router_model": "router-m", "worker_model": "worker-m"}

        async def check(**settings: Any) -> doctor.Check:
            async with httpx.AsyncClient(timeout=doctor.TIMEOUT) as http:
                return await doctor.check_model(Settings(**{"llm": llm, **settings}), http)

        good = await check(openai_base_url=server.url, openai_api_key=FAKE_API_KEY)
        wrong_key = await check(openai_base_url=server.url, openai_api_key="sk-wrong-canary")
        no_v1 = await check(
            openai_base_url=server.url.removesuffix("/v1"), openai_api_key=FAKE_API_KEY
        )
        unknown = await check(
            openai_base_url=server.url,
            openai_api_key=FAKE_API_KEY,
            llm={"router_model": "gpt-9", "worker_model": "worker-m"},
        )
    assert good.ok, good
    assert "serves router-m, worker-m" in good.detail
    assert not wrong_key.ok
    assert "refuses the key (401)" in wrong_key.detail
    assert "sk-wrong-canary" not in wrong_key.detail + (wrong_key.fix or "")
    assert not no_v1.ok
    assert no_v1.fix is not None
    assert "/v1" in no_v1.fix
    assert not unknown.ok
    assert "does not serve gpt-9" in unknown.detail
    assert unknown.fix is not None
    assert "router-m, worker-m" in unknown.fix


def test_unsafe_access_settings_are_flagged(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in list(os.environ):
        if name.startswith(("SUPERAGENT_", "OPENAI_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("SUPERAGENT_STATE_DIR", str(tmp_path))
    # A short token: production would refuse it, development is told.
    monkeypatch.setenv("SUPERAGENT_ADMIN_TOKEN", "short-token-canary")
    check = doctor.check_admin_token(Settings())
    assert not check.ok
    assert "openssl rand" in (check.fix or "")
    assert "short-token-canary" not in check.detail
    # No token: the one the first start generates, kept private.
    monkeypatch.delenv("SUPERAGENT_ADMIN_TOKEN")
    assert "first start generates" in doctor.check_admin_token(Settings()).detail
    generated = admin_token.for_server(Settings())
    assert generated.admin_token is not None
    assert doctor.check_admin_token(Settings()).ok
    (tmp_path / "admin-token").chmod(0o644)
    leaked = doctor.check_admin_token(Settings())
    assert not leaked.ok
    assert "readable by other users" in leaked.detail
    assert generated.admin_token.get_secret_value() not in leaked.detail + (leaked.fix or "")


async def test_identities_a_migration_could_not_convert_are_flagged(
    database_url: str, pool: asyncpg.Pool
) -> None:
    clean = await doctor.check_identities(database_url)
    assert clean.ok, clean
    await pool.execute(
        "INSERT INTO policy_versions (id, name, version, body, author) "
        "VALUES ('pol_doctor01', 'ingest', 9999, $1::jsonb, 'test')",
        json.dumps({"unresolved": ["sources.slack.users: alice"]}),
    )
    await pool.execute("INSERT INTO people (id, name) VALUES ('prs_doctor01', 'dana')")
    await pool.execute(
        "INSERT INTO accounts (source, handle, person_id) "
        "VALUES ('github', 'unresolved:dana-gh', 'prs_doctor01')"
    )
    flagged = await doctor.check_identities(database_url)
    assert not flagged.ok
    assert "1 policy entries and 1 account links" in flagged.detail
    assert "superagent admission edit" in (flagged.fix or "")


def test_the_local_devices_last_sandbox_check_is_shown(tmp_path: Path) -> None:
    """`up --device`'s endpointd keeps its last `endpointd sandbox check` in its state
    dir; doctor reads it there: nothing without such a device, how to run it before it
    ran, and a failure naming the classes that escaped after a real check that failed."""
    settings = Settings(state_dir=tmp_path)
    assert doctor.check_device_sandbox(settings) is None
    device = tmp_path / "device"
    (device / "config").mkdir(parents=True)
    (device / "config" / "config.json").write_text("{}")  # paired
    policy = device / "config" / "policy.toml"
    policy.write_text(f'allowed_roots = ["{tmp_path}"]\nsandbox = "off"\n')
    policy.chmod(0o600)
    never = doctor.check_device_sandbox(settings)
    assert never is not None
    assert never.ok
    assert never.detail.startswith("never run: ENDPOINTD_CONFIG_DIR="), never.detail
    assert never.detail.endswith("endpointd sandbox check")

    home = Path(tempfile.mkdtemp(prefix="h"))  # the check plants its canaries there
    try:
        env = {
            **clean_env(HOME=str(home), PYTHON_KEYRING_BACKEND="keyring.backends.fail.Keyring"),
            "ENDPOINTD_CONFIG_DIR": str(device / "config"),
            "ENDPOINTD_STATE_DIR": str(device / "state"),
            "ENDPOINTD_DATA_DIR": str(device / "data"),
        }
        ran = subprocess.run(
            [sys.executable, "-m", "endpointd", "sandbox", "check"],
            cwd=tempfile.gettempdir(),
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert ran.returncode == 3, ran.stdout + ran.stderr
    checked = doctor.check_device_sandbox(settings)
    assert checked is not None
    assert not checked.ok
    assert checked.detail.startswith("ESCAPED: persistence, sockets"), checked.detail
    assert checked.fix is not None
    assert "endpointd sandbox check" in checked.fix
