"""This machine as a device of ``superagent up --device DIR``: paired once, then supervised.

A newcomer's first message is usually ``/run …``, and with no device it can only answer
"no paired device". So ``up --device ~/src`` makes the machine it runs on a device: the
first time, it issues a pairing code itself and runs ``endpointd pair`` against its own
gateway (over loopback, pinning the gateway's CA by fingerprint like any device); from then
on it runs ``endpointd run`` as a supervised child (controlplane.children).

The daemon is the same program a laptop runs, with the same local policy and sandbox: the
control plane only starts it. Its files live under the state directory (``device/config``,
``device/state``, ``device/data``), apart from an endpointd the user may have paired with
another control plane in the usual places. Its key goes to the OS keyring, or, on a
machine without one (a headless server, a container), to a 0600 file in its config dir.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import sys
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from controlplane.children import SupervisedChild
from controlplane.db.urls import asyncpg_dsn
from controlplane.gateway import pairing
from controlplane.gateway.tls import gateway_tls
from controlplane.services import sleep_unless
from controlplane.settings import Settings

log = logging.getLogger(__name__)

CREATED_BY = "up"
# endpointd's paired configuration (endpointd.config.CONFIG_FILE): present once paired.
_PAIRED_MARKER = "config.json"
_KEY_FILE = "device.key"
# The gateway is a sibling service and may not listen yet when pairing starts.
_LISTEN_ATTEMPTS = 120  # every 0.5 s
_PAIR_TIMEOUT = 60.0


@dataclass(frozen=True)
class DeviceHome:
    """Where the local endpointd keeps its config, state and workspaces."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / "config"

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def paired(self) -> bool:
        return (self.config / _PAIRED_MARKER).is_file()

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "ENDPOINTD_CONFIG_DIR": str(self.config),
            "ENDPOINTD_STATE_DIR": str(self.state),
            "ENDPOINTD_DATA_DIR": str(self.data),
            # The control plane's state (its database socket, admin token): endpointd keeps
            # it out of every command's view (endpointd.guard.view).
            "SUPERAGENT_STATE_DIR": str(self.root.parent),
        }


def device_home(settings: Settings) -> DeviceHome:
    return DeviceHome(settings.state_dir / "device")


def default_device_name() -> str:
    """This machine's short host name, as people call it ("laptop", "devbox")."""
    return socket.gethostname().split(".", 1)[0] or "this-machine"


def _endpointd(*args: str) -> list[str]:
    # The daemon is installed with the control plane (a dependency), in this interpreter.
    # -P: the working directory is not searched, so a checkout's `endpointd/` distribution
    # folder cannot shadow the installed package.
    return [sys.executable, "-P", "-m", "endpointd", *args]


@dataclass(frozen=True)
class LocalDeviceRequest:
    """What ``up --device`` asked for: the allowed root (None: as paired before), the name,
    and where to say how it went."""

    root: Path | None
    name: str
    announce: Callable[[str], None]


class LocalDevice(SupervisedChild):
    """Pairs this machine on first start, then keeps ``endpointd run`` going."""

    name = "local-device"
    label = "this machine's endpointd"

    def __init__(
        self,
        settings: Settings,
        dsn: str,
        *,
        request: LocalDeviceRequest,
        backoff_cap: float,
    ) -> None:
        super().__init__(backoff_cap=backoff_cap)
        self.settings = settings
        self.dsn = dsn
        self.root = request.root
        self.device_name = request.name
        self.announce = request.announce
        self.home = device_home(settings)

    def argv(self) -> Sequence[str]:
        return _endpointd("run", "--parent-pid", str(os.getpid()))

    def env(self) -> Mapping[str, str]:
        return self.home.env()

    def cwd(self) -> str:
        return str(self.home.root)

    async def prepare(self) -> bool:
        self.home.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self.home.paired:
            name = _paired_name(self.home) or self.device_name
            roots = policy_roots(self.home)
            where = ", ".join(str(r) for r in roots) or "no allowed root yet"
            self.announce(f"This machine is device {name!r}, working in {where}.")
            if self.root is not None and self.root not in roots:
                # The policy is the device owner's file: `up` never rewrites it.
                self.announce(
                    f"  {self.root} is not among its allowed roots: add it to allowed_roots "
                    f"in {self.home.config / 'policy.toml'}"
                )
            return True
        try:
            if self.root is None:  # its files were removed since `up` checked
                raise DevicePairingFailed("it is not paired; start `up` with --device DIR")
            name = await self._pair(self.root)
        except DevicePairingFailed as exc:
            self.announce(f"Could not make this machine a device: {exc}")
            return False
        self.announce(
            f"This machine is now device {name!r}, working in {self.root} "
            f"(its local policy: {self.home.config / 'policy.toml'}). Its commands reach the"
            " network only through endpointd's proxy, to the hosts listed in [proxy]"
            " allow_hosts there (none yet). "
            f'Try: superagent say "/run {name} echo hello"'
        )
        return True

    async def _pair(self, root: Path) -> str:
        # Once per machine, so a connection of its own rather than a share of the pool.
        conn = await asyncpg.connect(self.dsn)
        try:
            name = await self._free_name(conn)
            issued = await pairing.create_code(
                conn, device_name=name, owner=None, created_by=CREATED_BY
            )
        finally:
            await conn.close()
        args = ["pair", self._gateway_url(), issued.code, "--name", name]
        # A new policy's network: only through endpointd's proxy, to the hosts the owner
        # lists (docs/security.md, section 7, says why this is the default here).
        args += ["--allow-root", str(root), "--network", "proxy"]
        tls = await asyncio.to_thread(gateway_tls, self.settings)
        if tls is not None:
            args += ["--fingerprint", tls.fingerprint]
        if not await self._keyring_usable():
            self.home.config.mkdir(parents=True, exist_ok=True, mode=0o700)
            args += ["--key-file", str(self.home.config / _KEY_FILE)]
        if not await self._gateway_listens():
            raise DevicePairingFailed("the device gateway did not start listening")
        code, output = await _run(_endpointd(*args), self.home)
        if code != 0:
            raise DevicePairingFailed(
                output.strip().splitlines()[-1] if output.strip() else f"exit {code}"
            )
        return name

    async def _gateway_listens(self) -> bool:
        """Wait until the gateway (a sibling service, maybe still starting) takes connections."""
        for _ in range(_LISTEN_ATTEMPTS):
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.settings.grpc.port)
            except OSError:
                if await sleep_unless(self.stopping, 0.5):
                    return False
                continue
            writer.close()
            return True
        return False

    async def _free_name(self, conn: asyncpg.Connection) -> str:
        """The device name, or name-2, name-3… when another device has it."""
        taken = {
            row["name"]
            for row in await conn.fetch(
                "SELECT name FROM devices WHERE revoked_at IS NULL AND name LIKE $1",
                self.device_name + "%",
            )
        }
        for candidate in (self.device_name, *(f"{self.device_name}-{n}" for n in range(2, 100))):
            if candidate not in taken:
                return candidate
        raise DevicePairingFailed(f"every name like {self.device_name!r} is taken")

    def _gateway_url(self) -> str:
        scheme = "http" if self.settings.grpc.tls == "off" else "https"
        return f"{scheme}://127.0.0.1:{self.settings.grpc.port}"

    async def _keyring_usable(self) -> bool:
        code, output = await _run(_endpointd("info", "--json"), self.home)
        if code != 0:
            return False
        try:
            return bool(json.loads(output)["keyring"]["usable"])
        except (ValueError, KeyError, TypeError):
            return False


class DevicePairingFailed(Exception):
    """Why this machine could not become a device, in one line."""


def _paired_name(home: DeviceHome) -> str | None:
    try:
        data = json.loads((home.config / _PAIRED_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    name = data.get("device_name") if isinstance(data, dict) else None
    return name if isinstance(name, str) else None


async def _run(argv: Sequence[str], home: DeviceHome) -> tuple[int, str]:
    """Run to completion: (exit code, stdout and stderr together)."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        env=home.env(),
        cwd=home.root,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), _PAIR_TIMEOUT)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return -1, "endpointd did not answer within a minute"
    return proc.returncode or 0, out.decode("utf-8", "replace")


async def paired_devices(database_url: str) -> int:
    """How many devices are paired (0 on a database not yet migrated)."""
    conn = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        count = await conn.fetchval("SELECT count(*) FROM devices WHERE revoked_at IS NULL")
    except asyncpg.UndefinedTableError:
        return 0
    finally:
        await conn.close()
    return int(count)


def policy_roots(home: DeviceHome) -> list[Path]:
    """The allowed roots in the local endpointd's policy (what it really works in)."""
    try:
        with (home.config / "policy.toml").open("rb") as f:
            roots = tomllib.load(f).get("allowed_roots", [])
    except (OSError, tomllib.TOMLDecodeError):
        return []
    return [Path(r).expanduser() for r in roots if isinstance(r, str)]
