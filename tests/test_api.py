"""The HTTP app in process: probes, error mapping, no internals leaked."""

from __future__ import annotations

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from controlplane.api.app import create_app
from controlplane.api.state import AppState
from controlplane.db.engine import create_engine, transaction
from controlplane.errors import NotFound
from controlplane.settings import Settings


def client_for(engine: AsyncEngine, **settings: object) -> tuple[httpx.AsyncClient, AppState]:
    state = AppState(settings=Settings(**settings), engine=engine, replica_id="test-replica")  # type: ignore[arg-type]
    app = create_app(state)

    @app.get("/boom/domain")
    async def domain_error() -> None:
        raise NotFound("ticket tkt_x does not exist")

    @app.get("/boom/bug")
    async def bug() -> None:
        raise RuntimeError("internal detail canary-7731")

    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://test"), state


async def test_probes_with_a_live_database(engine: AsyncEngine) -> None:
    client, _ = client_for(engine)
    async with client:
        assert (await client.get("/healthz")).json()["status"] == "ok"
        ready = await client.get("/readyz")
        assert ready.status_code == 200
        assert ready.json() == {"status": "ready", "replica": "test-replica"}


async def test_readyz_reports_an_unreachable_database() -> None:
    dead = create_engine("postgresql://nobody:pw@127.0.0.1:1/none", pool_size=1)
    client, _ = client_for(dead)
    async with client:
        ready = await client.get("/readyz")
        assert (await client.get("/healthz")).status_code == 200
    await dead.dispose()
    assert ready.status_code == 503
    assert ready.json()["status"] == "unavailable"
    assert "pw" not in ready.text


async def test_errors_are_mapped_and_internals_hidden(engine: AsyncEngine) -> None:
    client, _ = client_for(engine)
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


async def test_console_says_when_no_model_is_set(engine: AsyncEngine) -> None:
    client, _ = client_for(engine)
    async with client:
        page = await client.get("/")
    assert "No model is set" in page.text

    configured, _ = client_for(engine, openai_base_url="https://user:pw-canary@llm.example/v1")
    async with configured:
        page = await configured.get("/")
    assert "llm.example" in page.text
    assert "pw-canary" not in page.text


async def test_console_shows_who_leads_and_whether_paused(
    engine: AsyncEngine, db: async_sessionmaker[AsyncSession]
) -> None:
    async with transaction(db) as session:
        await session.execute(
            text(
                "INSERT INTO leases (name, holder, acquired_at, renewed_at, expires_at) "
                "VALUES ('router', 'box-7:4242:ab12cd', now(), now(), now() + interval '15 s')"
            )
        )
        await session.execute(
            text("INSERT INTO pause (id, paused_by, reason) VALUES (1, 'ops', 'deploying')")
        )
    client, _ = client_for(engine)
    async with client:
        page = await client.get("/")
    assert page.status_code == 200
    assert "Router leader: box-7:4242:ab12cd (leading since" in page.text
    assert "Paused" in page.text
    assert "deploying" in page.text
