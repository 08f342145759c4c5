"""Run the real `endpointd` as a subprocess in throwaway directories (test helper).

``Endpointd(tmp_path)`` owns a config dir, a state dir and a key-file path under
``tmp_path`` and runs ``python -m endpointd ...`` with ENDPOINTD_CONFIG_DIR /
ENDPOINTD_STATE_DIR pointing there and keyring's fail backend (CI has no keyring, and
probing a real one could prompt), so every test is isolated and xdist-safe.

``cli(...)`` runs a one-shot command; ``start()`` launches ``endpointd run`` with its log in
``log_path``; ``stop()`` sends SIGTERM, ``kill9()`` simulates a crash. ``cleanup()`` (called
by the fixture) also kills every command process group a test left running, found through
the spools' ``child.pid`` files, so no test leaks processes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from superagent_shared.gateway_tls import format_fingerprint

__all__ = ["Endpointd", "endpointd_in", "start_paired"]


class Endpointd:
    def __init__(self, root: Path, *, name: str = "endpointd") -> None:
        self.root = root / name
        # endpointd's own files live beside the test's directory, not in it: the test's
        # directory is the allowed root, and the sandbox lets commands create files directly
        # in a root only when no denied path (such as these) lies beneath it.
        self.private = root.parent / f"{root.name}.{name}"
        self.config_dir = self.private / "config"
        self.state_dir = self.private / "state"
        self.data_dir = self.private / "data"  # the tickets' workspaces
        self.key_file = self.private / "device.key"
        self.log_path = self.private / "daemon.log"
        self.root.mkdir(parents=True, exist_ok=True)
        self.private.mkdir(parents=True, exist_ok=True)
        self.env = {
            **os.environ,
            "ENDPOINTD_CONFIG_DIR": str(self.config_dir),
            "ENDPOINTD_STATE_DIR": str(self.state_dir),
            "ENDPOINTD_DATA_DIR": str(self.data_dir),
            "PYTHON_KEYRING_BACKEND": "keyring.backends.fail.Keyring",
            "ENDPOINTD_SERVICE_DIR": str(self.private / "service"),
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.device_id = ""

    def use_file_keyring(self, directory: Path) -> None:
        """Keep credentials in a plaintext file keyring under ``directory`` (CI has no
        desktop keyring), so that ``endpointd creds add`` works; no desktop notifications."""
        self.env["PYTHON_KEYRING_BACKEND"] = "keyrings.alt.file.PlaintextKeyring"
        self.env["XDG_DATA_HOME"] = str(directory)
        self.env["ENDPOINTD_NO_NOTIFY"] = "1"

    def cli(
        self, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        # Outside the checkout: `-m` puts the cwd first on sys.path, and at the repo root the
        # distribution directory `endpointd/` would shadow the package.
        return subprocess.run(
            [sys.executable, "-m", "endpointd", *args],
            cwd=tempfile.gettempdir(),
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=60,
        )

    def pair(self, url: str, code: str, *extra: str) -> subprocess.CompletedProcess[str]:
        # The tests' files live under the pytest tmp dir, so that is the allowed root.
        proc = self.cli(
            "pair",
            url,
            code,
            "--key-file",
            str(self.key_file),
            "--allow-root",
            str(self.root.parent),
            *extra,
        )
        if proc.returncode == 0:
            for word in proc.stdout.split():
                if word.startswith("dev_"):
                    self.device_id = word
                    break
        return proc

    def pair_with(self, gateway: object, *extra: str) -> str:
        """Pair against a FakeGateway (with its fingerprint when TLS); returns device id."""
        from tests.fakes.gateway_server import FakeGateway

        assert isinstance(gateway, FakeGateway)
        code = gateway.add_pairing_code(f"CODE{len(gateway.pair_requests):04d}")
        args = list(extra)
        if gateway.certs is not None:
            args += ["--fingerprint", format_fingerprint(gateway.certs.cert_sha256)]
        proc = self.pair(gateway.url, code, *args)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert self.device_id
        return self.device_id

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "endpointd", "run", "--log-level", "debug", *args],
                cwd=tempfile.gettempdir(),
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        finally:
            log.close()
        return self.proc

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self, timeout: float = 15) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.terminate()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(15)

    def spool_pids(self, name: str) -> list[int]:
        pids = []
        for path in (self.state_dir / "spool").glob(f"*/{name}"):
            with contextlib.suppress(ValueError, OSError):
                pids.append(int(path.read_text().strip()))
        return pids

    def cleanup(self) -> None:
        self.stop()
        for pgid in self.spool_pids("child.pid"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        for pid in self.spool_pids("supervisor.pid"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def endpointd_in(tmp_path: Path) -> Iterator[Endpointd]:
    """An :class:`Endpointd` under ``tmp_path``, cleaned up (processes killed) on exit.

    Test modules wrap it in their own ``endpointd`` fixture.
    """
    daemon = Endpointd(tmp_path)
    try:
        yield daemon
    finally:
        daemon.cleanup()


async def start_paired(gateway: object, daemon: Endpointd, *run_args: str) -> str:
    """Pair ``daemon`` with ``gateway``, start `endpointd run`, wait until it is connected."""
    from tests.fakes.gateway_server import FakeGateway
    from tests.support.helpers import assert_eventually

    assert isinstance(gateway, FakeGateway)
    device_id = daemon.pair_with(gateway)
    daemon.start(*run_args)
    await assert_eventually(
        lambda: gateway.connected(device_id),
        timeout=20,
        message=f"endpointd never connected; log:\n{daemon.log()}",
    )
    return device_id
