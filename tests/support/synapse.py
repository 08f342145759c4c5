"""A real Synapse homeserver for the Matrix tests, started on loopback by the test suite.

This module owns:

* :class:`Homeserver`: one Synapse process on ``127.0.0.1`` (a free port), configured in a
  temporary directory: SQLite, no federation listener, registration closed except through
  the shared-secret admin API, rate limits raised so tests are not throttled, no stats.
* :meth:`Homeserver.register`: a user created through ``/_synapse/admin/v1/register`` (the
  HMAC-signed shared-secret registration), returned as a :class:`MatrixUser` that speaks
  the client-server API over raw HTTP, as any Matrix client does.
* The session-scoped fixture ``synapse``. Each xdist worker that uses it starts its own
  homeserver (nothing is shared between processes); only
tests/controlplane/channels/test_matrix.py uses it.

Synapse runs from its own virtualenv, ``.synapse-venv``, made by ``scripts/bootstrap``;
without it the fixture fails (never skips) and says so.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.support.helpers import free_port

REPO = Path(__file__).resolve().parents[2]
SYNAPSE_VENV = Path(os.environ.get("SUPERAGENT_SYNAPSE_VENV", REPO / ".synapse-venv"))
SERVER_NAME = "localhost"
_START_TIMEOUT = 60.0
_LOTS = {"per_second": 10000, "burst_count": 10000}


class MatrixRequestError(Exception):
    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body

    @property
    def errcode(self) -> str:
        return str(self.body.get("errcode", "")) if isinstance(self.body, dict) else ""


@dataclass
class MatrixUser:
    """A registered user, calling the client-server API with its own access token."""

    homeserver: str
    user_id: str
    access_token: str
    device_id: str
    password: str

    @property
    def localpart(self) -> str:
        return self.user_id[1:].split(":", 1)[0]

    async def call(
        self, method: str, path: str, body: Any = None, *, version: str = "v3", **params: Any
    ) -> Any:
        async with httpx.AsyncClient(base_url=self.homeserver, timeout=30) as client:
            response = await client.request(
                method,
                f"/_matrix/client/{version}{path}",
                json=body,
                params=params or None,
                headers={"Authorization": f"Bearer {self.access_token}"},
            )
        payload = response.json() if response.content else {}
        if response.status_code >= 400:
            raise MatrixRequestError(response.status_code, payload)
        return payload

    async def create_room(self, *, invite: list[str], name: str = "Ops") -> str:
        room = await self.call(
            "POST", "/createRoom", {"preset": "private_chat", "name": name, "invite": invite}
        )
        return str(room["room_id"])

    async def join(self, room_id: str) -> None:
        await self.call("POST", f"/join/{quote(room_id)}", {})

    async def send(self, room_id: str, content: dict[str, Any]) -> str:
        txn = secrets.token_hex(8)
        sent = await self.call("PUT", f"/rooms/{quote(room_id)}/send/m.room.message/{txn}", content)
        return str(sent["event_id"])

    async def say(
        self,
        room_id: str,
        body: str,
        *,
        mentions: list[str] | None = None,
        thread_root: str | None = None,
    ) -> str:
        """An m.text message, as Element sends it: intentional mentions, thread relation."""
        content: dict[str, Any] = {"msgtype": "m.text", "body": body}
        if mentions is not None:
            content["m.mentions"] = {"user_ids": mentions}
        if thread_root is not None:
            content["m.relates_to"] = {
                "rel_type": "m.thread",
                "event_id": thread_root,
                "is_falling_back": True,
                "m.in_reply_to": {"event_id": thread_root},
            }
        return await self.send(room_id, content)

    async def event(self, room_id: str, event_id: str) -> dict[str, Any]:
        found: dict[str, Any] = await self.call(
            "GET", f"/rooms/{quote(room_id)}/event/{quote(event_id)}"
        )
        return found

    async def relations(
        self, room_id: str, event_id: str, rel_type: str, event_type: str | None = None
    ) -> list[dict[str, Any]]:
        path = f"/rooms/{quote(room_id)}/relations/{quote(event_id)}/{rel_type}"
        if event_type:
            path += f"/{event_type}"
        found = await self.call("GET", path, version="v1", limit=100)
        chunk: list[dict[str, Any]] = found["chunk"]
        return chunk

    async def joined_members(self, room_id: str) -> set[str]:
        found = await self.call("GET", f"/rooms/{quote(room_id)}/joined_members")
        return set(found["joined"])


@dataclass
class Homeserver:
    url: str
    server_name: str
    shared_secret: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    async def register(self, localpart: str, *, admin: bool = False) -> MatrixUser:
        """A new user, through the shared-secret registration API (HMAC-SHA1 over the nonce,
        user name, password and admin flag, NUL-separated)."""
        password = secrets.token_urlsafe(16)
        async with httpx.AsyncClient(base_url=self.url, timeout=30) as client:
            nonce = (await client.get("/_synapse/admin/v1/register")).json()["nonce"]
            mac = hmac.new(self.shared_secret.encode(), digestmod=hashlib.sha1)
            for part in (nonce, localpart, password):
                mac.update(part.encode())
                mac.update(b"\x00")
            mac.update(b"admin" if admin else b"notadmin")
            response = await client.post(
                "/_synapse/admin/v1/register",
                json={
                    "nonce": nonce,
                    "username": localpart,
                    "password": password,
                    "admin": admin,
                    "mac": mac.hexdigest(),
                },
            )
        if response.status_code != 200:
            raise MatrixRequestError(response.status_code, response.json())
        body = response.json()
        return MatrixUser(
            homeserver=self.url,
            user_id=body["user_id"],
            access_token=body["access_token"],
            device_id=body["device_id"],
            password=password,
        )

    def stop(self) -> None:
        if self.process.poll() is None:
            # Nothing to keep (its database goes with the directory): a short grace only.
            self.process.terminate()
            try:
                self.process.wait(2)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def _signing_key() -> str:
    # Synapse's key file format: "ed25519 <key id> <unpadded base64 of the 32-byte seed>".
    seed = base64.b64encode(os.urandom(32)).decode().rstrip("=")
    return f"ed25519 a_test {seed}\n"


def _config(directory: Path, port: int, shared_secret: str) -> dict[str, Any]:
    return {
        "server_name": SERVER_NAME,
        "public_baseurl": f"http://127.0.0.1:{port}/",
        "pid_file": str(directory / "homeserver.pid"),
        "listeners": [
            {
                "port": port,
                "bind_addresses": ["127.0.0.1"],
                "type": "http",
                "tls": False,
                "x_forwarded": False,
                # Client API (with /_synapse/admin) only: no federation resource at all.
                "resources": [{"names": ["client"], "compress": False}],
            }
        ],
        "database": {"name": "sqlite3", "args": {"database": str(directory / "homeserver.db")}},
        "log_config": str(directory / "log.yaml"),
        "media_store_path": str(directory / "media"),
        "signing_key_path": str(directory / "signing.key"),
        "registration_shared_secret": shared_secret,
        "enable_registration": False,
        "report_stats": False,
        "macaroon_secret_key": secrets.token_hex(16),
        "form_secret": secrets.token_hex(16),
        "trusted_key_servers": [],
        "suppress_key_server_warning": True,
        "federation_domain_whitelist": [],
        "presence": {"enabled": False},
        "enable_metrics": False,
        "url_preview_enabled": False,
        "rc_message": _LOTS,
        "rc_registration": _LOTS,
        "rc_login": {"address": _LOTS, "account": _LOTS, "failed_attempts": _LOTS},
        "rc_joins": {"local": _LOTS, "remote": _LOTS},
        "rc_joins_per_room": _LOTS,
        "rc_invites": {"per_room": _LOTS, "per_user": _LOTS, "per_issuer": _LOTS},
        "rc_admin_redaction": _LOTS,
    }


_LOG_CONFIG = """\
version: 1
formatters:
  plain:
    format: '%(asctime)s %(name)s %(levelname)s %(message)s'
handlers:
  console:
    class: logging.StreamHandler
    formatter: plain
root:
  level: WARNING
  handlers: [console]
loggers:
  synapse.storage.SQL:
    level: WARNING
disable_existing_loggers: false
"""


def start_homeserver(directory: Path) -> Homeserver:
    python = SYNAPSE_VENV / "bin" / "python"
    if not python.exists():
        pytest.fail(
            f"Synapse is not installed ({python} is missing): run scripts/bootstrap, which "
            "installs it into .synapse-venv for the Matrix tests",
            pytrace=False,
        )
    port = free_port()
    shared_secret = secrets.token_hex(16)
    (directory / "media").mkdir()
    (directory / "signing.key").write_text(_signing_key())
    (directory / "log.yaml").write_text(_LOG_CONFIG)
    config_path = directory / "homeserver.yaml"
    # JSON is YAML: no YAML writer needed on this side.
    config_path.write_text(json.dumps(_config(directory, port, shared_secret), indent=2))
    log_path = directory / "synapse.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [str(python), "-m", "synapse.app.homeserver", "-c", str(config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=directory,
        )
    server = Homeserver(
        url=f"http://127.0.0.1:{port}",
        server_name=SERVER_NAME,
        shared_secret=shared_secret,
        process=process,
        log_path=log_path,
    )
    deadline = time.monotonic() + _START_TIMEOUT
    while True:
        if process.poll() is not None:
            pytest.fail(f"Synapse exited with {process.returncode}:\n{server.log_tail()}")
        try:
            if httpx.get(f"{server.url}/_matrix/client/versions", timeout=1).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            server.stop()
            pytest.fail(f"Synapse did not answer within {_START_TIMEOUT}s:\n{server.log_tail()}")
        time.sleep(0.1)


@pytest.fixture(scope="session")
def synapse() -> Iterator[Homeserver]:
    """A running Synapse for this test worker, stopped at the end of the session."""
    directory = Path(tempfile.mkdtemp(prefix="superagent-synapse-"))
    server = start_homeserver(directory)
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)
