"""The HTTP app in process: probes, error mapping, no internals leaked."""

from __future__ import annotations

import asyncpg
import httpx

from controlplane.api.app import create_app
from controlplane.errors import NotFound
from controlplane.settings import Settings
from controlplane.web.state import AppState
from tests.support.database import unreachable_pool

TOKEN = "api-test-token-8c2e41f0a7d35b96e1c4"


def client_for(pool: asyncpg.Pool, **settings: object) -> tuple[httpx.AsyncClient, AppState]:
    settings.setdefault("admin_token", TOKEN)
    state = AppState(settings=Settings(**settings), pool=pool, replica_id="test-replica")  # type: ignore[arg-type]
    app = create_app(state)

    @app.get("/boom/domain")
    async def domain_error() -> None:
        raise NotFound("ticket tkt_x does not exist")

    @app.get("/boom/bug")
    async def bug() -> None:
        raise RuntimeError("internal detail canary-7731")

    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    # The probes need no token; the routes added here are protected as every other one.
    headers = {"Authorization": f"Bearer {TOKEN}"}
    return httpx.AsyncClient(transport=transport, base_url="http://test", headers=headers), state


async def test_probes_with_a_live_database(pool: asyncpg.Pool) -> None:
    client, _ = client_for(pool)
    async with client:
        assert (await client.get("/healthz")).json()["status"] == "ok"
        ready = await client.get("/readyz")
        assert ready.status_code == 200
        assert ready.json() == {"status": "ready", "replica": "test-replica"}


async def test_readyz_reports_an_unreachable_database() -> None:
    dead = await unreachable_pool()
    client, _ = client_for(dead)
    async with client:
        ready = await client.get("/readyz")
        assert (await client.get("/healthz")).status_code == 200
    await dead.close()
    assert ready.status_code == 503
    assert ready.json()["status"] == "unavailable"
    assert "pw" not in ready.text


async def test_errors_are_mapped_and_internals_hidden(pool: asyncpg.Pool) -> None:
    client, _ = client_for(pool)
    async with client:
        missing = await client.get("/boom/domain")
        bug = await client.get("/boom/bug")
    assert missing.status_code == 404
    assert missing.json() == {
        "error": {"code": "not_found", "message": "ticket tkt_x does not exist"}
    }
    assert bug.status_code == 500
    assert "canary-7731" not in bug.text
    assert bug.json()["error"]["code"] == "internal"
