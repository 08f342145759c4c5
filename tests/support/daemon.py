"""Running the real endpointd in tests: pair it, start it, kill it, read its status."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.helpers import assert_eventually


@dataclass
class Daemon:
    """One endpointd installation: its own config dir, state dir and key file."""

    home: Path
    # The allowed root (default: the directory holding ``home``). Keep endpointd's own files
    # out of it where commands write: the sandbox lets a command create files directly in a
    # root only when no denied path (such as endpointd's state dir) lies beneath it.
    work: Path | None = None
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "ENDPOINTD_CONFIG_DIR": str(self.home / "config"),
            "ENDPOINTD_STATE_DIR": str(self.home / "state"),
            "ENDPOINTD_DATA_DIR": str(self.home / "data"),
            "PYTHON_KEYRING_BACKEND": "keyring.backends.fail.Keyring",
        }

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "endpointd", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
            cwd=self.home,
        )

    async def pair(self, url: str, code: str, *extra: str) -> subprocess.CompletedProcess[str]:
        # In a thread: the gateway under test may share this event loop and must answer.
        return await asyncio.to_thread(
            self.cli,
            "pair",
            url,
            code,
            "--key-file",
            str(self.home / "device.key"),
            "--allow-root",
            str(self.work or self.home.parent),
            *extra,
        )

    def start(self) -> subprocess.Popen[bytes]:
        log = open(self.home / "endpointd.log", "ab")  # noqa: SIM115 - lives with the process
        process = subprocess.Popen(
            [sys.executable, "-m", "endpointd", "run"],
            env=self.env,
            cwd=self.home,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.processes.append(process)
        return process

    def kill(self, process: subprocess.Popen[bytes]) -> None:
        """SIGKILL the daemon alone: what it supervises must survive it."""
        process.send_signal(signal.SIGKILL)
        process.wait(10)

    def stop_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(10)

    async def status(self) -> dict[str, object]:
        result = await asyncio.to_thread(self.cli, "status", "--json")
        data = json.loads(result.stdout)
        assert isinstance(data, dict)
        return data

    async def connected(self) -> bool:
        daemon = (await self.status()).get("daemon")
        return isinstance(daemon, dict) and daemon.get("state") == "connected"

    def log(self) -> str:
        path = self.home / "endpointd.log"
        return path.read_text(errors="replace") if path.exists() else ""

    async def wait_connected(self, timeout: float = 30) -> None:
        async def connected() -> bool:
            return await self.connected()

        await assert_eventually(connected, timeout=timeout, interval=0.2, message=self.log())


@contextmanager
def daemon_beside(tmp_path: Path) -> Iterator[Daemon]:
    """A daemon whose files sit beside the test's directory, which is its allowed root (see
    ``Daemon.work``); every process it started is stopped afterwards."""
    home = tmp_path.parent / f"{tmp_path.name}.device"
    home.mkdir()
    instance = Daemon(home, work=tmp_path)
    try:
        yield instance
    finally:
        instance.stop_all()
