"""`superagent serve` (or `superagent watchdog`) as a real process a test can kill with
SIGKILL, start again, and stop cleanly; its output goes to a log file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx


@dataclass
class ReplicaProcess:
    env: dict[str, str]
    log: Path
    http_port: int = 0  # 0: no HTTP (the watchdog)
    command: str = "serve"
    process: subprocess.Popen[bytes] | None = None
    kills: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "controlplane.cli", self.command],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill9(self) -> None:
        if self.alive():
            assert self.process is not None
            self.process.kill()
            self.process.wait(15)
            self.kills += 1

    def stop(self) -> None:
        if not self.alive():
            return
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)

    async def up(self) -> bool:
        """Whether it answers /readyz (its database reachable)."""
        try:
            async with httpx.AsyncClient() as client:
                return (await client.get(f"{self.url}/readyz")).status_code == 200
        except httpx.HTTPError:
            return False


async def prepare_database(url: str, allowlisted: list[str]) -> None:
    """Migrate the database at ``url`` and allow ``allowlisted`` users by default, as an
    admin would before starting ``serve`` (which never migrates)."""
    from controlplane.db import migrate
    from controlplane.ingest.admission import Admission, SourceAdmission
    from tests.support.helpers import save_policy

    await migrate.upgrade(url)
    await save_policy(url, Admission(default=SourceAdmission(users=allowlisted)))


def serve_env(
    database_url: str, model_url: str, state_dir: Path, http_port: int, **settings: str
) -> dict[str, str]:
    """The environment of a ``serve`` over ``database_url`` and the fake model at
    ``model_url``, with quick model retries; ``settings`` add or override variables."""
    from tests.fakes.openai_server import FAKE_API_KEY
    from tests.support.helpers import free_port

    return {
        **os.environ,
        "DATABASE_URL": database_url,
        "SUPERAGENT_STATE_DIR": str(state_dir),
        "SUPERAGENT_HTTP__PORT": str(http_port),
        "SUPERAGENT_GRPC__PORT": str(free_port()),
        "OPENAI_BASE_URL": model_url,
        "OPENAI_API_KEY": FAKE_API_KEY,
        "SUPERAGENT_LLM__ATTEMPTS": "2",
        "SUPERAGENT_LLM__RETRY_BASE_SECONDS": "0.05",
        "SUPERAGENT_LLM__TIMEOUT_SECONDS": "2",
        **settings,
    }
