"""Log lines: plain by default, JSON on request, and each request's lines carry its trace id."""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane import logs
from controlplane.api.app import create_app
from controlplane.settings import Settings
from controlplane.web.state import AppState
from tests.support.helpers import assert_eventually, free_port

TRACE_ID = re.compile(r"^[0-9a-f]{32}$")


@pytest.fixture
def json_lines() -> Iterator[io.StringIO]:
    """What the root logger writes, formatted as with SUPERAGENT_LOG_FORMAT=json."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JsonFormatter())
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def lines_of(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


TOKEN = "logs-test-token-5d0a9e3c71b24f68a2e9"


def client_for(pool: asyncpg.Pool) -> httpx.AsyncClient:
    settings = Settings(admin_token=TOKEN)
    app = create_app(AppState(settings=settings, pool=pool, replica_id="test-replica"))

    @app.get("/work")
    async def work() -> dict[str, str]:
        logging.getLogger("tests.work").info("working on it")
        return {"done": "yes"}

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("a bug")

    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    return httpx.AsyncClient(transport=transport, base_url="http://test", headers=headers)


async def test_a_request_s_lines_carry_its_trace_id(
    pool: asyncpg.Pool, json_lines: io.StringIO
) -> None:
    parent = "4bf92f3577b34da6a3ce929d0e0e4736"
    async with client_for(pool) as client:
        given = await client.get("/work", headers={"X-Request-Id": "req-7.a:b"})
        traced = await client.get(
            "/work", headers={"traceparent": f"00-{parent}-00f067aa0ba902b7-01"}
        )
        fresh = await client.get("/work")
        forged = await client.get("/work", headers={"X-Request-Id": 'x" level="ERROR'})
        failed = await client.get("/boom", headers={"X-Request-Id": "req-boom"})

    assert given.headers["X-Request-Id"] == "req-7.a:b"
    assert traced.headers["X-Request-Id"] == parent
    assert TRACE_ID.match(fresh.headers["X-Request-Id"])
    # An id that could break a plain log line is replaced, not echoed.
    assert TRACE_ID.match(forged.headers["X-Request-Id"])
    assert failed.status_code == 500

    work = [line for line in lines_of(json_lines) if line["message"] == "working on it"]
    assert [line["trace_id"] for line in work] == [
        "req-7.a:b",
        parent,
        fresh.headers["X-Request-Id"],
        forged.headers["X-Request-Id"],
    ]
    assert all(line["logger"] == "tests.work" and line["level"] == "INFO" for line in work)
    # The unexpected error is logged outside every middleware, and still names its request.
    error = next(line for line in lines_of(json_lines) if line["message"].startswith("unhandled"))
    assert error["trace_id"] == "req-boom"
    assert error["level"] == "ERROR"
    assert "RuntimeError: a bug" in error["exception"]


def test_background_work_sets_its_own_trace_id(json_lines: io.StringIO) -> None:
    log = logging.getLogger("tests.loop")
    log.info("before")
    with logs.trace("sweep-1"):
        log.info("inside")
        with logs.trace() as nested:
            log.info("nested")
        log.info("inside again")
    log.info("after")
    lines = {line["message"]: line for line in lines_of(json_lines)}
    assert "trace_id" not in lines["before"]
    assert lines["inside"]["trace_id"] == "sweep-1"
    assert lines["nested"]["trace_id"] == nested
    assert TRACE_ID.match(nested)
    assert lines["inside again"]["trace_id"] == "sweep-1"
    assert "trace_id" not in lines["after"]
    assert logs.current_trace_id() is None


_LOG_SOME = (
    "import logging; from controlplane.cli.common import setup_logging; "
    "from controlplane.logs import trace; setup_logging('INFO'); "
    "log = logging.getLogger('demo'); log.info('plain line')\n"
    "with trace('job-9'): log.warning('traced line')"
)


def _log_some(**env: str) -> list[str]:
    base = {k: v for k, v in os.environ.items() if k != logs.FORMAT_ENV}
    result = subprocess.run(
        [sys.executable, "-c", _LOG_SOME],
        capture_output=True,
        text=True,
        timeout=60,
        env={**base, **env},
    )
    assert result.returncode == 0, result.stderr
    return result.stderr.splitlines()


def test_plain_text_stays_the_default() -> None:
    for lines in (_log_some(), _log_some(SUPERAGENT_LOG_FORMAT="plain")):
        assert len(lines) == 2
        assert re.match(
            r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO    demo: plain line$", lines[0]
        )
        assert lines[1].endswith("WARNING demo: traced line")


def test_json_format_writes_one_object_per_line() -> None:
    first, second = (json.loads(line) for line in _log_some(SUPERAGENT_LOG_FORMAT="json"))
    assert first.keys() == {"time", "level", "logger", "message"}
    assert first["level"] == "INFO"
    assert first["logger"] == "demo"
    assert first["message"] == "plain line"
    assert first["time"].endswith("+00:00")
    assert second["trace_id"] == "job-9"


def test_an_unknown_format_says_so_and_keeps_plain_text() -> None:
    lines = _log_some(SUPERAGENT_LOG_FORMAT="xml")
    assert "SUPERAGENT_LOG_FORMAT='xml' is not one of plain, json; logging plain text" in lines[0]
    assert lines[1].endswith("INFO    demo: plain line")


def _serve(env: dict[str, str], stderr: Path) -> subprocess.Popen[bytes]:
    with stderr.open("wb") as errors:
        return subprocess.Popen(
            [sys.executable, "-m", "controlplane.cli", "serve"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=errors,
        )


def _log_lines(stderr: str) -> list[dict[str, Any]]:
    """The JSON log lines; the only other line allowed is the banner `serve` prints for
    people (not a log line)."""
    lines = stderr.splitlines()
    others = [line for line in lines if not line.startswith("{")]
    assert all(line.startswith("Super-agent on http://") for line in others), others
    return [json.loads(line) for line in lines if line.startswith("{")]


async def test_a_replica_logs_json_with_the_trace_id_of_each_request(
    db: async_sessionmaker[AsyncSession], database_url: str, tmp_path: Path
) -> None:
    """`superagent serve` with SUPERAGENT_LOG_FORMAT=json, over real HTTP."""
    secret = "webhook-secret-canary-5521"
    port = free_port()
    stderr = tmp_path / "stderr"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SUPERAGENT_", "OPENAI_"))},
        "DATABASE_URL": database_url,
        "SUPERAGENT_STATE_DIR": str(tmp_path / "state"),
        "SUPERAGENT_HTTP__PORT": str(port),
        "SUPERAGENT_GRPC__PORT": "0",
        "SUPERAGENT_GITHUB__WEBHOOK_SECRET": secret,
        "SUPERAGENT_LOG_FORMAT": "json",
    }
    replica = _serve(env, stderr)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:

            async def healthy() -> bool:
                try:
                    return (await client.get("/healthz")).status_code == 200
                except httpx.TransportError:
                    assert replica.poll() is None, stderr.read_text()
                    return False

            await assert_eventually(healthy, timeout=60, interval=0.1)
            body = b'{"zen": "Keep it logically awesome.", "hook_id": 1}'
            signature = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
            ping = await client.post(
                "/webhooks/github",
                content=body,
                headers={
                    "X-GitHub-Event": "ping",
                    "X-GitHub-Delivery": "delivery-1",
                    "X-Hub-Signature-256": signature,
                    "X-Request-Id": "req-ping-1",
                },
            )
            # Without a configured token the replica generated one in its state directory.
            token = (tmp_path / "state" / "admin-token").read_text().strip()
            metrics = await client.get("/metrics", headers={"Authorization": f"Bearer {token}"})
        assert ping.status_code == 200, ping.text
        assert ping.headers["X-Request-Id"] == "req-ping-1"
        assert metrics.status_code == 200
        assert "superagent_scrape_up" in metrics.text

        def logged() -> list[dict[str, Any]]:
            lines = _log_lines(stderr.read_text())
            assert any(line["message"].startswith("github delivery delivery-1") for line in lines)
            return lines

        lines = await assert_eventually(logged, timeout=10)
        ignored = next(line for line in lines if line["message"].startswith("github delivery"))
        assert ignored["trace_id"] == "req-ping-1"
        assert ignored["logger"] == "controlplane.channels.github.routes"
        assert all({"time", "level", "logger", "message"} <= line.keys() for line in lines)
        assert secret not in stderr.read_text()
    finally:
        replica.terminate()
        replica.wait(30)
