"""`superagent up` run as a user runs it, for the tests of ``up --device``: its own state
directory and ports, no OS keyring, and an endpointd config elsewhere than the one ``up``
makes (whatever endpointd this user may have is not the one ``up`` runs)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from tests.support.helpers import free_port

# A headless machine: no OS keyring at all (keyring's "fail" backend refuses every call).
NO_KEYRING = "keyring.backends.fail.Keyring"


class Up:
    """`superagent up` as a user runs it, its stdout and stderr in one log."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env = env
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, *args: str, stdin: int | None = subprocess.DEVNULL) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "controlplane.cli", "up", *args],
                env=self.env,
                stdin=stdin,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


@contextlib.contextmanager
def up_in(tmp_path: Path, database_url: str | None) -> Iterator[Up]:
    """An :class:`Up` (not started) whose state lies under ``tmp_path``; ``database_url``:
    the Postgres it uses, None for its embedded one. Stopped (killed if need be) after."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SUPERAGENT_", "OPENAI_")) and k != "DATABASE_URL"
    }
    env.update(
        {
            "SUPERAGENT_STATE_DIR": str(tmp_path / "state"),
            "SUPERAGENT_HTTP__PORT": str(free_port()),
            "SUPERAGENT_GRPC__PORT": str(free_port()),
            "PYTHON_KEYRING_BACKEND": NO_KEYRING,
            "ENDPOINTD_CONFIG_DIR": str(tmp_path / "elsewhere" / "config"),
            "ENDPOINTD_STATE_DIR": str(tmp_path / "elsewhere" / "state"),
        }
    )
    if database_url is not None:
        env["DATABASE_URL"] = database_url
    runner = Up(env, tmp_path / "up.log")
    try:
        yield runner
    finally:
        runner.stop()
        if runner.process is not None and runner.process.poll() is None:
            runner.process.kill()
