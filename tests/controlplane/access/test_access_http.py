"""Who may reach the control plane over HTTP, played by the attacker (docs/security.md).

No surface trusts "looking local": not a ``Host`` header anyone can send, not a loopback
peer (a local reverse proxy, another user of a shared machine). Every HTTP and websocket
surface needs the admin token or a server-side session made from it; the token is
generated (0600) when none is configured, refused when short in production, never taken
from a URL; sign-ins are counted per peer; sessions end on the server.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import websockets
from pydantic import SecretStr, ValidationError
from starlette.routing import Route

from controlplane.access import middleware, sessions
from controlplane.access.middleware import is_public
from controlplane.api.app import create_app
from controlplane.channels.base import Channels
from controlplane.channels.context import ChannelContext
from controlplane.channels.webchat.adapter import WebChatAdapter
from controlplane.db.urls import asyncpg_dsn
from controlplane.ingest.intake import Intake
from controlplane.runtime import HttpService
from controlplane.settings import Settings
from controlplane.web.state import AppState
from tests.repo.test_deploy import final_stage, image_env, instruction
from tests.support.cli_output import one_line_error
from tests.support.helpers import assert_eventually, free_port
from tests.support.replica_process import ReplicaProcess

TOKEN = "access-test-token-0123456789abcdef-canary"
LOCAL_HOSTS = ("127.0.0.1:8420", "localhost:8420", "[::1]:8420", "10.0.0.7")
# What a local reverse proxy adds: the real client was far away, but the peer is loopback.
PROXIED = {"X-Forwarded-For": "203.0.113.9", "X-Real-IP": "203.0.113.9", "Forwarded": "for=x"}


def _app(pool: asyncpg.Pool, **settings: object) -> AppState:
    return AppState(
        settings=Settings(**settings),  # type: ignore[arg-type]
        pool=pool,
        replica_id="test-replica",
        channels=Channels(),
    )


@asynccontextmanager
async def _client(
    state: AppState, *, peer: str = "127.0.0.1", host: str = "127.0.0.1:8420"
) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(state), client=(peer, 40000))
    async with httpx.AsyncClient(transport=transport, base_url=f"http://{host}") as client:
        yield client


def _routes(routes: list[Any]) -> Iterator[Any]:
    for route in routes:
        included = getattr(route, "original_router", None)  # FastAPI's included routers
        if included is not None:
            yield from _routes(included.routes)
        else:
            yield route


def _protected_routes(state: AppState) -> list[tuple[str, str]]:
    """(method, path) of every route that is not public, path parameters filled in: the
    API docs, the channels' and the console's routes, and any route added later."""
    found: list[tuple[str, str]] = []
    for route in _routes(create_app(state).routes):
        if not isinstance(route, Route) or is_public(route.path):
            continue
        path = re.sub(r"\{[^}]+\}", "x", route.path)
        found.extend((method, path) for method in sorted(route.methods or ()))
    return found


# -- in process: every route, every local-looking way in ----------------------------------


async def test_without_a_token_no_route_trusts_a_local_host_or_a_loopback_peer(
    pool: asyncpg.Pool,
) -> None:
    state = _app(pool, admin_token=None)
    routes = _protected_routes(state)
    # The console, its API, the chat's API, the metrics and the API docs are all in it.
    paths = {path for _, path in routes}
    for wanted in ("/console", "/console/api/overview", "/chat", "/chat/api/threads", "/metrics"):
        assert wanted in paths, wanted
    for host in LOCAL_HOSTS:
        async with _client(state, host=host) as client:
            for method, path in routes:
                for extra in ({}, PROXIED):
                    answer = await client.request(method, path, headers=extra)
                    assert answer.status_code in (401, 403), (host, method, path, answer.text)


async def test_with_a_token_every_route_needs_it_and_the_docs_too(pool: asyncpg.Pool) -> None:
    state = _app(pool, admin_token=TOKEN)
    async with _client(state) as client:
        for method, path in _protected_routes(state):
            answer = await client.request(method, path, headers=PROXIED)
            assert answer.status_code in (401, 403), (method, path)
            assert TOKEN not in answer.text
        assert (await client.get("/openapi.json")).status_code == 401
        good = {"Authorization": f"Bearer {TOKEN}"}
        assert (await client.get("/openapi.json", headers=good)).status_code == 200
        # Probes and the sign-in page stay open; they carry nothing.
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.get("/console/login")).status_code == 200


async def test_the_token_is_never_taken_from_a_url(pool: asyncpg.Pool) -> None:
    state = _app(pool, admin_token=TOKEN)
    async with _client(state) as client:
        for path in ("/console/api/overview", "/metrics", "/chat", "/chat/api/threads"):
            answer = await client.get(path, params={"token": TOKEN})
            assert answer.status_code == 401, path
            assert "set-cookie" not in answer.headers


async def test_metrics_take_a_bearer_token_from_any_peer_and_nothing_else(
    pool: asyncpg.Pool,
) -> None:
    state = _app(pool, admin_token=TOKEN)
    async with _client(state, peer="127.0.0.1") as local:
        refused = await local.get("/metrics")
        assert refused.status_code == 401
        assert "Bearer" in refused.json()["error"]["message"]
    async with _client(state, peer="198.51.100.4") as remote:
        scraped = await remote.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        assert scraped.status_code == 200
        assert "superagent_" in scraped.text


async def test_a_browser_without_a_session_gets_the_sign_in_form(pool: asyncpg.Pool) -> None:
    state = _app(pool, admin_token=TOKEN)
    async with _client(state) as client:
        page = await client.get("/console/tickets", headers={"Accept": "text/html"})
        assert page.status_code == 401
        assert 'action="/console/login"' in page.text
        assert "/console/tickets" in page.text  # where the sign-in leads
        assert "frame-ancestors 'self'" in page.headers["content-security-policy"]


async def test_dns_rebinding_names_are_refused_on_a_loopback_bind(pool: asyncpg.Pool) -> None:
    state = _app(pool, admin_token=TOKEN)
    async with _client(state) as client:
        secret = await _sign_in(client)
    # A page on attacker.example, resolving to 127.0.0.1, with the browser's session.
    async with _client(state, host="attacker.example:8420") as client:
        client.cookies.set(sessions.COOKIE, secret)
        answer = await client.get("/console/api/overview")
        assert answer.status_code == 401
        assert "SUPERAGENT_HTTP__ALLOWED_HOSTS" in answer.json()["error"]["message"]
    named = _app(pool, admin_token=TOKEN, http={"allowed_hosts": "agent.example"})
    async with _client(named, host="agent.example") as client:
        client.cookies.set(sessions.COOKIE, secret)
        assert (await client.get("/console/api/overview")).status_code == 200


# -- sessions ------------------------------------------------------------------------------


async def _sign_in(client: httpx.AsyncClient, token: str = TOKEN) -> str:
    signed = await client.post("/console/login", data={"token": token, "next": "/console"})
    assert signed.status_code == 303, signed.text
    secret = signed.cookies.get(sessions.COOKIE)
    assert secret
    assert token not in secret
    return secret


async def test_a_session_ends_on_the_server_at_sign_out(pool: asyncpg.Pool) -> None:
    state = _app(pool, admin_token=TOKEN)
    async with _client(state) as client:
        secret = await _sign_in(client)
        assert (await client.get("/console/api/tickets")).status_code == 200
        await client.post("/console/logout")
    # The attacker kept a copy of the cookie: it opens nothing any more.
    async with _client(state) as thief:
        thief.cookies.set(sessions.COOKIE, secret)
        assert (await thief.get("/console/api/tickets")).status_code == 401
    rows = await pool.fetch("SELECT secret_hash, revoked_at FROM console_sessions")
    assert all(row["secret_hash"] != secret.encode() for row in rows)  # only a hash is kept
    assert any(row["revoked_at"] is not None for row in rows)


async def test_a_session_expires_on_the_server_and_with_its_token(pool: asyncpg.Pool) -> None:
    brief = _app(pool, admin_token=TOKEN, http={"session_seconds": 1})
    async with _client(brief) as client:
        secret = await _sign_in(client)
    await asyncio.sleep(1.5)
    async with _client(brief) as client:
        client.cookies.set(sessions.COOKIE, secret)  # as if the browser kept it longer
        assert (await client.get("/console/api/tickets")).status_code == 401
    state = _app(pool, admin_token=TOKEN)
    async with _client(state) as client:
        secret = await _sign_in(client)
    rotated = _app(pool, admin_token=TOKEN + "-rotated")
    async with _client(rotated) as client:
        client.cookies.set(sessions.COOKIE, secret)
        assert (await client.get("/console/api/tickets")).status_code == 401


async def test_a_one_time_link_signs_in_once(pool: asyncpg.Pool) -> None:
    state = _app(pool, admin_token=TOKEN)
    secret = await sessions.create_link(pool, TOKEN)
    async with _client(state) as client:
        used = await client.get("/console/login", params={"once": secret})
        assert used.status_code == 303
        assert used.headers["location"] == "/console"
        assert (await client.get("/console/api/tickets")).status_code == 200
    async with _client(state) as again:
        spent = await again.get("/console/login", params={"once": secret})
        assert spent.status_code == 401
        assert sessions.COOKIE not in spent.cookies


async def test_the_chat_page_sends_the_consoles_csp_and_no_inline_script(
    pool: asyncpg.Pool, database_url: str
) -> None:
    state = _app(pool, admin_token=TOKEN)
    context = ChannelContext(state.settings, pool, Intake(pool), asyncpg_dsn(database_url), "r")
    state.channels = Channels([WebChatAdapter(context)])
    async with _client(state) as client:
        await _sign_in(client)
        console = await client.get("/console/chat")
        chat = await client.get("/chat")
    assert chat.status_code == 200
    assert chat.headers["content-security-policy"] == console.headers["content-security-policy"]
    assert "frame-ancestors 'self'" in chat.headers["content-security-policy"]
    # default-src 'self' forbids inline code: everything the page runs is a file of its own.
    assert "<script>" not in chat.text
    assert "<style>" not in chat.text
    assert "/chat/static/chat.js" in chat.text


# -- sign-in attempts ----------------------------------------------------------------------


async def test_sign_ins_are_counted_per_peer_exactly_under_a_burst(pool: asyncpg.Pool) -> None:
    state = _app(pool, admin_token=TOKEN, http={"signin_attempts": 10})
    async with _client(state, peer="2001:db8:1:2::10") as client:
        answers = await asyncio.gather(
            *(client.post("/console/login", data={"token": f"guess-{i}"}) for i in range(40))
        )
        codes = sorted(answer.status_code for answer in answers)
        assert codes == [401] * 10 + [429] * 30
        # Locked out: even the right token waits for the window.
        locked = await client.post("/console/login", data={"token": TOKEN})
        assert locked.status_code == 429
        assert int(locked.headers["retry-after"]) > 0
    # The same /64 is the same peer; another address is not.
    async with _client(state, peer="2001:db8:1:2:ffff::1") as neighbour:
        assert (await neighbour.post("/console/login", data={"token": TOKEN})).status_code == 429
    async with _client(state, peer="192.0.2.50") as other:
        assert (await other.post("/console/login", data={"token": TOKEN})).status_code == 303


async def test_wrong_bearer_tokens_count_too(pool: asyncpg.Pool) -> None:
    state = _app(pool, admin_token=TOKEN, http={"signin_attempts": 3})
    async with _client(state, peer="192.0.2.77") as client:
        wrong = {"Authorization": "Bearer guess"}
        codes = [(await client.get("/metrics", headers=wrong)).status_code for _ in range(5)]
        assert codes == [401, 401, 401, 429, 429]


async def test_a_peer_locked_out_by_wrong_bearer_tokens_has_no_token_compared(
    pool: asyncpg.Pool,
) -> None:
    """Bearer guesses are counted before they are compared: a burst cannot outrun the
    count, and once a peer is over the limit even the right token waits for the window
    (a guess that happens to be right is not let through, nor timed)."""
    state = _app(pool, admin_token=TOKEN, http={"signin_attempts": 5})
    async with _client(state, peer="198.51.100.23") as client:
        guesses = [{"Authorization": f"Bearer guess-{i}"} for i in range(20)]
        answers = await asyncio.gather(*(client.get("/metrics", headers=g) for g in guesses))
        assert sorted(answer.status_code for answer in answers) == [401] * 5 + [429] * 15
        locked = await client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        assert locked.status_code == 429, locked.text
        assert int(locked.headers["retry-after"]) > 0
    # Another peer is not locked out, and right tokens do not count against anyone.
    async with _client(state, peer="192.0.2.51") as other:
        for _ in range(8):
            ok = await other.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
            assert ok.status_code == 200, ok.text


def test_production_refuses_an_admin_token_under_32_characters() -> None:
    with pytest.raises(ValidationError, match="at least 32 characters"):
        Settings(environment="production", admin_token=SecretStr("x7" * 15 + "y"))
    assert Settings(environment="production", admin_token=SecretStr("x7" * 16)).admin_token


# -- real processes ------------------------------------------------------------------------


def _env(tmp_path: Path, database_url: str, port: int, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("SUPERAGENT_") and k not in ("OPENAI_BASE_URL", "OPENAI_API_KEY")
    }
    env.update(
        DATABASE_URL=database_url,
        SUPERAGENT_STATE_DIR=str(tmp_path / "state"),
        SUPERAGENT_HTTP__PORT=str(port),
        SUPERAGENT_GRPC__PORT="0",
        **extra,
    )
    return env


@asynccontextmanager
async def _tcp_proxy(port: int) -> AsyncIterator[int]:
    """A reverse proxy on loopback: every client it forwards is 127.0.0.1 to the server."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection("127.0.0.1", port)
        await asyncio.gather(pipe(client_r, server_w), pipe(server_r, client_w))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


async def _ws_refused(url: str) -> int | None:
    async with websockets.connect(url, additional_headers={"Host": "127.0.0.1"}) as ws:
        first = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert first["type"] == "error"
        with pytest.raises(websockets.ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 10)
        return ws.close_code


@pytest.mark.slow
async def test_up_generates_a_private_token_prints_a_link_and_say_uses_it(
    pool: asyncpg.Pool, database_url: str, tmp_path: Path
) -> None:
    port = free_port()
    env = _env(tmp_path, database_url, port)
    log = tmp_path / "up.log"
    up = ReplicaProcess(env, log, port, command="up")
    up.start()
    try:
        link = await assert_eventually(
            lambda: re.search(r"http://\S+/console/login\?once=\S+", log.read_text()),
            timeout=90,
            interval=0.1,
        )
        token_file = tmp_path / "state" / "admin-token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = token_file.read_text().strip()
        assert len(token) >= 32

        # The terminal's own CLI reads the token from the state directory.
        said = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "controlplane.cli", "say", "/devices"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert said.returncode == 0, said.stderr
        assert "No devices are paired" in said.stdout

        # Through a local reverse proxy, with a local-looking Host: nothing without the token.
        async with _tcp_proxy(port) as proxy_port, httpx.AsyncClient() as client:
            base = f"http://127.0.0.1:{proxy_port}"
            for path in (
                "/console",
                "/console/api/overview",
                "/chat",
                "/chat/api/threads",
                "/metrics",
            ):
                answer = await client.get(base + path, headers={"Host": "127.0.0.1"})
                assert answer.status_code in (401, 403), (path, answer.status_code)
            for path in ("/console/ws?topics=tickets", "/chat/ws"):
                code = await _ws_refused(f"ws://127.0.0.1:{proxy_port}{path}")
                assert code == 1008, path
            # The printed link signs a browser in once; the token opens the API.
            used = await client.get(link.group(0), follow_redirects=False)
            assert used.status_code == 303
            assert sessions.COOKIE in used.cookies
            again = await client.get(link.group(0), follow_redirects=False)
            assert again.status_code == 401
            good = {"Authorization": f"Bearer {token}"}
            assert (
                await client.get(f"{base}/console/api/overview", headers=good)
            ).status_code == 200
    finally:
        up.stop()
    assert token not in log.read_text(), "the admin token reached the log"


@pytest.mark.parametrize("command", ["up", "serve"])
def test_a_server_beyond_loopback_without_a_token_refuses_to_start(
    command: str, tmp_path: Path
) -> None:
    env = _env(tmp_path, "postgresql://nobody@127.0.0.1:9/none", free_port())
    env["SUPERAGENT_HTTP__HOST"] = "0.0.0.0"  # noqa: S104 - the attacker's exposure
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "controlplane.cli", command],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    line = one_line_error(proc)
    assert "SUPERAGENT_ADMIN_TOKEN" in line
    assert time.monotonic() - started < 30
    assert not (tmp_path / "state" / "admin-token").exists()


def test_the_container_image_refuses_to_run_without_a_token(tmp_path: Path) -> None:
    """`docker run -p 8420:8420 IMAGE` with no environment: the image's own ENV and CMD."""
    command = json.loads(instruction(final_stage(), "CMD")[-1])
    assert command[0] == "superagent"
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), **image_env()}
    env["SUPERAGENT_STATE_DIR"] = str(tmp_path / "state")
    assert "SUPERAGENT_ADMIN_TOKEN" not in env
    proc = subprocess.run(
        [sys.executable, "-m", "controlplane.cli", *command[1:]],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "SUPERAGENT_ADMIN_TOKEN" in one_line_error(proc)


async def test_an_open_websocket_ends_with_its_session(
    pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(middleware, "SESSION_RECHECK_SECONDS", 0.2)
    state = _app(pool, admin_token=TOKEN, http={"port": 0})
    http = HttpService(state)
    await http.start()
    try:
        await assert_eventually(lambda: http.server.started)
        base = f"http://127.0.0.1:{http.port}"
        async with httpx.AsyncClient(base_url=base) as client:
            secret = await _sign_in(client)
            cookie = {"Cookie": f"{sessions.COOKIE}={secret}"}
            url = f"ws://127.0.0.1:{http.port}/console/ws?topics=tickets"
            async with websockets.connect(url, additional_headers=cookie) as ws:
                assert json.loads(await asyncio.wait_for(ws.recv(), 10))["type"] == "ready"
                await client.post("/console/logout")
                with pytest.raises(websockets.ConnectionClosed):
                    await asyncio.wait_for(ws.recv(), 10)
                assert ws.close_code == 1008
    finally:
        await http.stop(5)
