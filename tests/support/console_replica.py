"""The console tests' replica: `superagent serve` serving the console, and the app in process.

``replica`` runs `superagent serve` (no model: no worker service of its own) with an admin
token on the test worker's database; :func:`up` waits until it is ready, and
:func:`sign_in` signs a browser's page in. :func:`in_process` is the same app over the
test's pool, for HTTP rules without a browser.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import httpx
import pytest
from playwright.async_api import Page, expect

from controlplane.api.app import create_app
from controlplane.settings import Settings
from controlplane.web.state import AppState
from tests.support.helpers import assert_eventually, free_port

TOKEN = "console-test-token-5b1f0c"


@dataclass(frozen=True)
class Replica:
    url: str
    log: Path


@pytest.fixture(name="replica")
def replica_fixture(pool: asyncpg.Pool, database_url: str, tmp_path: Path) -> Iterator[Replica]:
    """`superagent serve` with an admin token, on this worker's database (``pool`` empties
    it first)."""
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "SUPERAGENT_STATE_DIR": str(tmp_path),
        "SUPERAGENT_HTTP__PORT": str(port),
        "SUPERAGENT_GRPC__PORT": "0",
        "SUPERAGENT_ADMIN_TOKEN": TOKEN,
    }
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY"):
        env.pop(name, None)
    log = tmp_path / "replica.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "controlplane.cli", "serve"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield Replica(f"http://127.0.0.1:{port}", log)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
        assert TOKEN not in log.read_text(errors="replace"), "the admin token reached the log"


async def _ready(url: str) -> bool:
    try:
        async with httpx.AsyncClient() as client:
            return (await client.get(f"{url}/readyz")).status_code == 200
    except httpx.HTTPError:
        return False


async def up(replica: Replica) -> str:
    await assert_eventually(lambda: _ready(replica.url), timeout=60, interval=0.1)
    return replica.url


async def sign_in(page: Page, url: str, path: str) -> None:
    """Sign ``page`` in with the admin token on its way to ``path``, where it then is."""
    await page.goto(f"{url}/console/login?next={path}")
    await page.fill("input[name=token]", TOKEN)
    await page.click("button[type=submit]")
    await expect(page).to_have_url(f"{url}{path}")


@asynccontextmanager
async def in_process(
    pool: asyncpg.Pool,
    host: str = "127.0.0.1",
    bearer: bool = False,
    **settings: object,
) -> AsyncIterator[httpx.AsyncClient]:
    """The app in this process, over ``pool``, with ``settings`` (the admin token by
    default); ``bearer``: every request carries it."""
    settings.setdefault("admin_token", TOKEN)
    state = AppState(
        settings=Settings(**settings),  # type: ignore[arg-type]
        replica_id="test-replica",
        pool=pool,
    )
    transport = httpx.ASGITransport(app=create_app(state))
    headers = {"Authorization": f"Bearer {TOKEN}"} if bearer else None
    async with httpx.AsyncClient(
        transport=transport, base_url=f"http://{host}", headers=headers
    ) as client:
        yield client
