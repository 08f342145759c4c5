"""Stopping a real replica always completes within ``SUPERAGENT_SHUTDOWN_TIMEOUT_SECONDS``: with its
stderr a pipe nobody reads any more (``superagent up 2>&1 | tee log`` after ``tee`` died),
and while webhooks keep arriving."""

from __future__ import annotations

import array
import asyncio
import fcntl
import json
import os
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

import httpx
import psutil
import pytest

from controlplane.channels.github.events import sign
from controlplane.db import migrate
from controlplane.ingest.admission import Admission, SourceAdmission
from tests.support.helpers import assert_eventually, free_port, save_policy

pytestmark = pytest.mark.slow

SHUTDOWN_TIMEOUT = 4.0
# A process needs a moment to be reaped and seen gone: not a second more than that.
SLACK = 1.5
SECRET = "shutdown-webhook-secret"
F_SETPIPE_SZ = 1031  # Linux; not in Python 3.11's fcntl module


@pytest.fixture
async def env(empty_database: str, tmp_path: Path) -> dict[str, str]:
    await migrate.upgrade(empty_database)
    # The load's author is allowlisted: every webhook is routed, acknowledged and logged.
    await save_policy(empty_database, Admission(sources={"github": SourceAdmission(users=["1"])}))
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERAGENT_", "OPENAI_"))}
    environ.update(
        {
            "DATABASE_URL": empty_database,
            "SUPERAGENT_STATE_DIR": str(tmp_path / "state"),
            "SUPERAGENT_HTTP__PORT": str(free_port()),
            "SUPERAGENT_GRPC__PORT": str(free_port()),
            "SUPERAGENT_SHUTDOWN_TIMEOUT_SECONDS": str(SHUTDOWN_TIMEOUT),
            "SUPERAGENT_GITHUB__WEBHOOK_SECRET": SECRET,
            "SUPERAGENT_GITHUB__API_URL": "http://127.0.0.1:9",
        }
    )
    return environ


def _start_piped(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "controlplane.cli", "serve"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


async def _serving(env: dict[str, str], process: subprocess.Popen[bytes]) -> None:
    url = f"http://127.0.0.1:{env['SUPERAGENT_HTTP__PORT']}/healthz"

    async def healthy() -> bool:
        if process.poll() is not None:  # not an AssertionError: that would mean "not yet"
            pytest.fail(f"the replica exited with {process.returncode} while starting")
        try:
            async with httpx.AsyncClient() as client:
                return (await client.get(url, timeout=2)).status_code == 200
        except httpx.HTTPError:
            return False

    await assert_eventually(healthy, timeout=90, interval=0.2, message="the replica serves")


async def _exits_within(process: subprocess.Popen[bytes], seconds: float) -> float:
    started = time.monotonic()
    try:
        await asyncio.to_thread(process.wait, seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)
        raise AssertionError(f"still running {seconds:.1f}s after the signal") from None
    return time.monotonic() - started


class Load:
    """Webhooks from several senders at once, until stopped."""

    def __init__(self, env: dict[str, str]) -> None:
        self.url = f"http://127.0.0.1:{env['SUPERAGENT_HTTP__PORT']}/webhooks/github"
        self.sent = 0
        self.stopping = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    def start(self, senders: int = 8) -> None:
        self.tasks = [asyncio.create_task(self._send(n)) for n in range(senders)]

    async def stop(self) -> None:
        self.stopping.set()
        await asyncio.gather(*self.tasks)

    async def _send(self, worker: int) -> None:
        async with httpx.AsyncClient(timeout=5) as client:
            while not self.stopping.is_set():
                body = json.dumps(
                    {
                        "action": "created",
                        "issue": {"number": worker, "title": "load"},
                        "comment": {
                            "id": self.sent + 1000 * worker,
                            "body": "@superagent hello",
                            "user": {"login": "alice", "id": 1, "type": "User"},
                        },
                        "repository": {"full_name": "acme/load"},
                        "sender": {"login": "alice", "id": 1, "type": "User"},
                    }
                ).encode()
                try:
                    await client.post(
                        self.url,
                        content=body,
                        headers={
                            "X-GitHub-Event": "issue_comment",
                            "X-GitHub-Delivery": f"load-{worker}-{self.sent}",
                            "X-Hub-Signature-256": sign(SECRET.encode(), body),
                            "Content-Type": "application/json",
                        },
                    )
                    self.sent += 1
                except httpx.HTTPError:
                    await asyncio.sleep(0.1)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
async def test_a_broken_stderr_pipe_never_keeps_the_process_alive(
    env: dict[str, str], sig: signal.Signals
) -> None:
    # `superagent serve 2>&1 | tee log`: tee dies on the Ctrl-C first, then the replica
    # gets the signal and has nowhere left to write its "stopping" line or its logs.
    process = _start_piped(env)
    try:
        await _serving(env, process)
        assert process.stderr is not None
        assert process.stdout is not None
        process.stderr.close()
        process.stdout.close()
        process.send_signal(sig)
        await _exits_within(process, SHUTDOWN_TIMEOUT + SLACK)
        # Stopped in order, not cut short by the deadline (which exits 128 + the signal).
        assert process.returncode == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


async def test_sigterm_with_logging_blocked_on_a_full_pipe_exits_within_the_timeout(
    env: dict[str, str],
) -> None:
    # `superagent serve 2>&1 | less`, and nobody scrolls: the pipe fills, and every log line
    # blocks the thread that writes it, the event loop's included. SIGTERM must still win.
    process = subprocess.Popen(  # noqa: ASYNC220 - started once, then only polled
        [sys.executable, "-m", "controlplane.cli", "serve"],
        env={**env, "SUPERAGENT_LOG_LEVEL": "DEBUG"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        assert process.stderr is not None
        reader = process.stderr.fileno()
        size = fcntl.fcntl(reader, F_SETPIPE_SZ, 4096)

        def full() -> bool:
            pending = array.array("i", [0])
            fcntl.ioctl(reader, termios.FIONREAD, pending)
            # Within one log line of full: the next line blocks its writer.
            return pending[0] > size - 512

        load = Load(env)
        load.start()  # each webhook is logged: the pipe fills, whatever was logged before
        try:
            await assert_eventually(full, timeout=60, interval=0.1, message="the pipe fills")
        finally:
            await load.stop()
        await asyncio.sleep(0.5)  # the writer is blocked now, wherever it was
        process.send_signal(signal.SIGTERM)
        await _exits_within(process, SHUTDOWN_TIMEOUT + SLACK)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


async def test_sigterm_while_webhooks_keep_arriving_exits_within_the_timeout(
    env: dict[str, str], tmp_path: Path
) -> None:
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(  # noqa: ASYNC220 - started once, then only polled
            [sys.executable, "-m", "controlplane.cli", "serve"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    load = Load(env)
    try:
        await _serving(env, process)
        # A deployment runs its watchdog separately: `serve` starts no child of its own.
        assert not psutil.Process(process.pid).children(recursive=True)
        load.start()
        await assert_eventually(lambda: load.sent >= 50, timeout=60, message="webhooks sent")
        process.send_signal(signal.SIGTERM)
        elapsed = await _exits_within(process, SHUTDOWN_TIMEOUT + SLACK)
    finally:
        await load.stop()
        if process.poll() is None:
            process.kill()
            process.wait(10)
    output = log.read_text(errors="replace")
    assert process.returncode == 0, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert elapsed < SHUTDOWN_TIMEOUT + SLACK
