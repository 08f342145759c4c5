"""`superagent serve` (or `superagent watchdog`) as a real process a test can kill with
SIGKILL, start again, and stop cleanly; its output goes to a log file."""

from __future__ import annotations

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
