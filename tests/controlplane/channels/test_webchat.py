"""The web chat as people use it: the app served by uvicorn on a loopback port, real
websocket clients, replies through the outbox's reply handler, and `superagent say` run as
a real process."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import asyncpg
import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed
from websockets.typing import Origin

from controlplane.channels import webchat
from controlplane.channels.base import Channels, OutboundMessage
from controlplane.channels.context import ChannelContext
from controlplane.channels.outbound import reply_handler
from controlplane.channels.webchat import events
from controlplane.db.urls import asyncpg_dsn
from controlplane.domain import EffectKind
from controlplane.effects.handlers import ClaimedEffect
from controlplane.ingest import routing
from controlplane.ingest.admission import Admission, SourceAdmission
from controlplane.ingest.intake import Intake
from controlplane.runtime import HttpService
from controlplane.services import Service
from controlplane.settings import HttpSettings, Settings, WebChatSettings
from controlplane.web.state import AppState
from superagent_shared.ids import new_id
from tests.support.helpers import assert_eventually, free_port, save_policy

TOKEN = "chat-token-5521-0a9b8c7d6e5f4a3b2c1d"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


def connect(url: str, **options: Any) -> ws_connect:
    """A chat socket that sends the admin token, unless ``additional_headers`` says else."""
    options.setdefault("additional_headers", BEARER)
    return ws_connect(url, **options)


@dataclass
class Served:
    url: str
    ws_url: str
    channels: Channels
    adapter: webchat.WebChatAdapter | None


@asynccontextmanager
async def serving(
    pool: asyncpg.Pool,
    database_url: str,
    *,
    token: str | None = TOKEN,
    enabled: bool = True,
    replica: str = "replica-a",
) -> AsyncIterator[Served]:
    """The control plane's HTTP app with the web chat, as a replica serves it."""
    settings = Settings(
        http=HttpSettings(host="127.0.0.1", port=0),
        admin_token=SecretStr(token) if token else None,
        webchat=WebChatSettings(enabled=enabled),
    )
    intake = Intake(pool)
    ctx = ChannelContext(settings, pool, intake, asyncpg_dsn(database_url), replica)
    adapter = webchat.build_adapter(ctx)
    assert adapter is None or isinstance(adapter, webchat.WebChatAdapter)
    channels = Channels([adapter] if adapter else [])
    state = AppState(
        settings=settings,
        pool=pool,
        replica_id=replica,
        intake=intake,
        channels=channels,
    )
    http = HttpService(state)
    services: list[Service] = [*(adapter.services() if adapter else []), http]
    for service in services:
        await service.start()
    try:
        await assert_eventually(lambda: http.server.started, message="uvicorn started")
        if adapter is not None:
            await assert_eventually(lambda: adapter.hub.listening, message="LISTEN connection")
        yield Served(
            url=f"http://127.0.0.1:{http.port}",
            ws_url=f"ws://127.0.0.1:{http.port}/chat/ws",
            channels=channels,
            adapter=adapter,
        )
    finally:
        for service in reversed(services):
            await service.stop(5)
        await channels.close()


@pytest.fixture
async def console_policy(db: async_sessionmaker[AsyncSession]) -> None:
    """The policy out of the box: it allowlists the group "console" for source "web"."""
    policy = Admission()
    assert policy.for_source("web") == SourceAdmission(groups=["console"])
    await save_policy(db, policy)


async def recv(ws: ClientConnection, timeout: float = 10.0) -> dict[str, Any]:
    async with asyncio.timeout(timeout):
        frame = json.loads(await ws.recv())
    assert isinstance(frame, dict)
    return frame


async def ready(ws: ClientConnection) -> dict[str, Any]:
    frame = await recv(ws)
    assert frame["type"] == "ready", frame
    return frame


async def say(
    ws: ClientConnection, text: str, thread: str | None = None, client_id: str | None = None
) -> str:
    client_id = client_id or str(uuid.uuid4())
    await ws.send(
        json.dumps({"type": "say", "thread": thread, "text": text, "client_id": client_id})
    )
    return client_id


async def reply(pool: asyncpg.Pool, channels: Channels, thread: str, text: str) -> str:
    """What the outbox does with the router's reply effect on this conversation."""
    row = await pool.fetchrow(
        "SELECT id, external_id FROM threads WHERE source = 'web' AND external_id = $1", thread
    )
    assert row is not None
    reply_id = new_id("msg")
    effect = ClaimedEffect(
        id=new_id("eff"),
        kind=EffectKind.REPLY,
        key=reply_id,
        payload={
            "reply_id": reply_id,
            "thread_id": row["id"],
            "source": "web",
            "thread_external_id": row["external_id"],
            "text": text,
        },
        generation=1,
        attempt=1,
    )
    await reply_handler(pool, channels)(effect)
    return reply_id


async def web_triggers(pool: asyncpg.Pool) -> list[asyncpg.Record]:
    return await pool.fetch(
        "SELECT t.*, th.external_id AS thread FROM triggers t "
        "JOIN threads th ON th.id = t.thread_id WHERE t.source = 'web' ORDER BY t.created_at"
    )


async def test_a_said_message_is_an_explicit_request_and_replies_reach_every_watcher(
    pool: asyncpg.Pool, database_url: str, console_policy: None
) -> None:
    async with (
        serving(pool, database_url) as served,
        connect(served.ws_url) as alice,
    ):
        assert (await ready(alice))["actor"] == "web:admin"
        client_id = await say(alice, "Why is CI red on main?")
        accepted = await recv(alice)
        assert accepted["type"] == "accepted"
        assert (accepted["client_id"], accepted["verdict"], accepted["route"]) == (
            client_id,
            "explicit",
            "router",
        )
        thread = accepted["thread"]
        own = await recv(alice)
        assert (own["type"], own["role"], own["thread"]) == ("message", "person", thread)
        assert (own["text"], own["client_id"], own["author"]) == (
            "Why is CI red on main?",
            client_id,
            "admin",
        )

        [trigger] = await web_triggers(pool)
        assert trigger["id"] == accepted["trigger"] == own["id"]
        assert (trigger["thread"], trigger["actor_id"], trigger["actor_is_bot"]) == (
            thread,
            "web:admin",
            False,
        )
        assert (trigger["verdict"], trigger["route"], trigger["kind"]) == (
            "explicit",
            "router",
            "message",
        )
        assert trigger["routed_at"] is None  # waiting in the router's inbox

        async with connect(served.ws_url) as bob:  # a second page on the same conversation
            await ready(bob)
            await bob.send(json.dumps({"type": "watch", "thread": thread}))
            history = await recv(bob)
            assert (history["id"], history["role"]) == (trigger["id"], "person")

            reply_id = await reply(pool, served.channels, thread, "Flaky test; fixing it.")
            for ws in (alice, bob):
                frame = await recv(ws)
                assert frame["type"] == "message"
                assert (frame["id"], frame["role"], frame["thread"], frame["text"]) == (
                    reply_id,
                    "agent",
                    thread,
                    "Flaky test; fixing it.",
                )

        # The outbox's own record after send() found the adapter's row: one message.
        sent = await pool.fetch("SELECT * FROM sent_messages WHERE reply_id = $1", reply_id)
        assert [(r["source"], r["external_id"]) for r in sent] == [("web", reply_id)]
        # Sent again (a retry after a crash between send and the effect's completion):
        # no second row, and nothing new reaches the socket.
        assert served.adapter is not None
        retried = OutboundMessage(
            reply_id=reply_id,
            thread_id=sent[0]["thread_id"],
            thread_external_id=thread,
            text="Flaky test; fixing it.",
            first_try=False,
        )
        assert await served.adapter.send(retried) == reply_id
        count = await pool.fetchval(
            "SELECT count(*) FROM sent_messages WHERE thread_id = $1", sent[0]["thread_id"]
        )
        assert count == 1
        again = await reply(pool, served.channels, thread, "second")
        frame = await recv(alice)
        assert frame["id"] == again  # the next frame is the next reply, not a repeat


async def test_history_and_conversation_list_survive_a_reload(
    pool: asyncpg.Pool, database_url: str, console_policy: None
) -> None:
    async with serving(pool, database_url) as served:
        async with connect(served.ws_url + "?name=carol") as ws:
            await ready(ws)
            await say(ws, "  Deploy\nthe   staging branch  ")
            thread = (await recv(ws))["thread"]
            await recv(ws)  # own message
            first_reply = await reply(pool, served.channels, thread, "Deploying now.")
            assert (await recv(ws))["id"] == first_reply
            # A ticket's report, on its home thread: the worker's, never shown as carol's.
            await worker_report(pool, thread, "tkt_000000000001", "READY: deployed")
            await say(ws, "Thanks", thread=thread)
            assert (await recv(ws))["thread"] == thread
        async with httpx.AsyncClient(base_url=served.url, headers=BEARER) as http:
            listed = (await http.get("/chat/api/threads", params={"name": "carol"})).json()
            # Every holder of the admin token is one principal; the name is only a label.
            assert listed["actor"] == "web:admin"
            assert [(t["thread"], t["title"]) for t in listed["threads"]] == [
                (thread, "Deploy the staging branch")
            ]
            others = (await http.get("/chat/api/threads")).json()  # name defaults to admin
            assert others == listed  # another name is the same principal, not another user

            history = await http.get(f"/chat/api/threads/{thread}/messages")
            assert history.status_code == 200
            messages = history.json()["messages"]
            assert [(m["role"], m["author"], m["text"]) for m in messages] == [
                ("person", "carol", "  Deploy\nthe   staging branch  "),
                ("agent", "agent", "Deploying now."),
                ("worker", "worker of tkt_000000000001", "READY: deployed"),
                ("person", "carol", "Thanks"),
            ]
            missing = await http.get("/chat/api/threads/chat_0000000000000000/messages")
            assert missing.status_code == 404
            assert "no conversation" in missing.json()["error"]["message"]
            bad_name = await http.get("/chat/api/threads", params={"name": "x" * 65})
            assert bad_name.status_code == 400

            page = await http.get("/chat")
            assert page.status_code == 200
            assert page.headers["content-type"].startswith("text/html")
            assert 'id="text"' in page.text
            script = await http.get("/chat/static/chat.js")  # the page's CSP forbids inline
            assert script.headers["content-type"].startswith("text/javascript")
            assert "/chat/ws" in script.text


async def test_a_resent_frame_records_nothing_twice(
    pool: asyncpg.Pool, database_url: str, console_policy: None
) -> None:
    async with serving(pool, database_url) as served:
        client_id = str(uuid.uuid4())
        async with connect(served.ws_url) as ws:
            await ready(ws)
            await say(ws, "Run the nightly job", client_id=client_id)
            first = await recv(ws)
        # The socket dropped before the page knew: it resends on a new one.
        async with connect(served.ws_url) as ws:
            await ready(ws)
            await say(ws, "Run the nightly job", client_id=client_id)
            second = await recv(ws)
            assert second["type"] == "accepted"
            assert second["duplicate"] is True
            assert (second["trigger"], second["thread"]) == (first["trigger"], first["thread"])
        assert len(await web_triggers(pool)) == 1
        threads = await pool.fetchval("SELECT count(*) FROM threads WHERE source = 'web'")
        assert threads == 1  # no second, empty conversation either


async def test_bad_frames_get_an_error_and_the_socket_stays_usable(
    pool: asyncpg.Pool, database_url: str, console_policy: None
) -> None:
    good = str(uuid.uuid4())

    def frame(**fields: Any) -> str:
        return json.dumps({"type": "say", "thread": None, "text": "hi", "client_id": good} | fields)

    bad: list[tuple[str | bytes, str]] = [
        ("this is not json", "not JSON"),
        ("[1, 2]", "JSON object"),
        (json.dumps({"type": "dance"}), "unknown frame type"),
        (frame(text=""), "text is empty"),
        (frame(text=" \n\t "), "text is empty"),
        (frame(text="x" * (events.MAX_TEXT_CHARS + 1)), "characters"),
        (frame(text="x" * (events.MAX_FRAME_CHARS + 1)), "KiB"),
        (frame(text="a\x00b"), "NUL"),
        (frame(text=["list"]), "text is empty"),
        (frame(client_id=None), "client_id"),
        (frame(client_id="short"), "client_id"),
        (frame(thread="chat_0000000000000000"), "no conversation"),
        (frame(thread="../etc"), "conversation id"),
        (json.dumps({"type": "watch"}), "conversation id"),
        (json.dumps({"type": "watch", "thread": "chat_0000000000000000"}), "no conversation"),
        (b"\x00binary", "binary"),
    ]
    async with serving(pool, database_url) as served, connect(served.ws_url) as ws:
        await ready(ws)
        for raw, expected in bad:
            await ws.send(raw)
            answer = await recv(ws)
            assert answer["type"] == "error", (raw[:80], answer)
            assert expected in answer["message"], (raw[:80], answer)
        assert await web_triggers(pool) == []
        await ws.send(frame(text="now a good one"))
        accepted = await recv(ws)
        assert accepted["type"] == "accepted"
        assert [t["text"] for t in await web_triggers(pool)] == ["now a good one"]


async def test_only_holders_of_the_admin_token_chat(
    pool: asyncpg.Pool, database_url: str, console_policy: None
) -> None:
    async with serving(pool, database_url) as served:
        for headers in ({}, {"Authorization": "Bearer wrong-token"}):
            async with connect(served.ws_url, additional_headers=headers) as ws:
                refused = await recv(ws)
                assert refused["type"] == "error"
                assert "admin token" in refused["message"]
                with pytest.raises(ConnectionClosed):
                    await recv(ws)
                assert ws.close_code == 1008
        # A token in the URL is never read, the right one included.
        async with connect(served.ws_url + f"?token={TOKEN}", additional_headers={}) as ws:
            await recv(ws)
            await ws.wait_closed()
            assert ws.close_code == 1008

        async with httpx.AsyncClient(base_url=served.url) as http:
            assert (await http.get("/chat/api/threads")).status_code == 401
            wrong = {"Authorization": "Bearer nope"}
            assert (await http.get("/chat/api/threads", headers=wrong)).status_code == 401
            assert (await http.get("/chat/api/threads", headers=BEARER)).status_code == 200
            assert (await http.get("/chat")).status_code == 401  # the page too
            assert (await http.get("/chat", params={"token": TOKEN})).status_code == 401
            # Its sign-in makes a session whose cookie is not the token.
            assert (await http.post("/chat/session", json={"token": "nope"})).status_code == 401
            signed = await http.post("/chat/session", json={"token": TOKEN})
            assert signed.status_code == 200
            cookie = signed.cookies.get("superagent_session")
            assert cookie
            assert TOKEN not in cookie
            assert (await http.get("/chat/api/threads")).status_code == 200  # by the cookie
            assert (await http.get("/chat")).status_code == 200

        assert await web_triggers(pool) == []  # nothing refused was recorded
        async with connect(served.ws_url) as ws:
            await ready(ws)
            await say(ws, "with the token")
            assert (await recv(ws))["verdict"] == "explicit"
        async with connect(
            served.ws_url, additional_headers={"Cookie": f"superagent_session={cookie}"}
        ) as ws:
            await ready(ws)


async def test_other_sites_pages_cannot_use_the_chat(
    pool: asyncpg.Pool, database_url: str, console_policy: None
) -> None:
    async with serving(pool, database_url) as served:
        # Cross-site websocket hijacking: a page elsewhere opening our socket.
        async with connect(served.ws_url, origin=Origin("http://evil.example")) as ws:
            refused = await recv(ws)
            assert "cross-origin" in refused["message"]
            await ws.wait_closed()
            assert ws.close_code == 1008
        async with connect(served.ws_url, origin=Origin(served.url)) as ws:
            await ready(ws)
        # DNS rebinding: another name resolving to this address.
        async with httpx.AsyncClient(base_url=served.url) as http:
            rebound = await http.get("/chat/api/threads", headers={"Host": "rebind.example"})
            assert rebound.status_code == 401
            assert "SUPERAGENT_HTTP__ALLOWED_HOSTS" in rebound.json()["error"]["message"]
        assert await web_triggers(pool) == []


async def test_a_reply_reaches_sockets_on_another_replica(
    pool: asyncpg.Pool, database_url: str, console_policy: None
) -> None:
    async with (
        serving(pool, database_url, replica="replica-a") as a,
        serving(pool, database_url, replica="replica-b") as b,
        connect(a.ws_url) as on_a,
        connect(b.ws_url) as on_b,
    ):
        await ready(on_a)
        await ready(on_b)
        await say(on_b, "Which tests are slow?")
        thread = (await recv(on_b))["thread"]
        await recv(on_b)  # own message
        await on_a.send(json.dumps({"type": "watch", "thread": thread}))
        assert (await recv(on_a))["role"] == "person"
        # Said on B, and A's watcher hears it through the NOTIFY.
        await say(on_b, "And which are flaky?", thread=thread)
        await recv(on_b)  # accepted
        assert (await recv(on_a))["text"] == "And which are flaky?"
        # The reply goes out on replica A; the socket on B hears it through the NOTIFY.
        reply_id = await reply(pool, a.channels, thread, "Three of them.")
        seen_on_b = [await recv(on_b), await recv(on_b)]
        assert [f["text"] for f in seen_on_b] == ["And which are flaky?", "Three of them."]
        assert seen_on_b[1]["id"] == reply_id
        assert (await recv(on_a))["id"] == reply_id


async def test_a_turned_off_chat_says_how_to_turn_it_on(
    pool: asyncpg.Pool, database_url: str
) -> None:
    async with serving(pool, database_url, enabled=False) as served:
        assert served.adapter is None
        async with httpx.AsyncClient(base_url=served.url, headers=BEARER) as http:
            page = await http.get("/chat")
            assert page.status_code == 404
            assert "SUPERAGENT_WEBCHAT__ENABLED" in page.json()["error"]["message"]
        async with connect(served.ws_url) as ws:
            assert "SUPERAGENT_WEBCHAT__ENABLED" in (await recv(ws))["message"]
            await ws.wait_closed()
            assert ws.close_code == 4404


# -- superagent say -----------------------------------------------------------------------


def cli_env(**extra: str) -> dict[str, str]:
    """The CLI's environment: the admin token unless ``extra`` says otherwise, and a state
    directory of its own (so no token generated by another `superagent up` is found)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERAGENT_", "OPENAI_"))}
    env.pop("DATABASE_URL", None)
    env["SUPERAGENT_ADMIN_TOKEN"] = TOKEN
    env["SUPERAGENT_STATE_DIR"] = "/nonexistent/superagent-test-state"
    env.update(extra)
    return {k: v for k, v in env.items() if v}


async def superagent_say(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "controlplane.cli",
        "say",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env or cli_env(),
    )
    try:
        async with asyncio.timeout(60):
            out, err = await process.communicate()
    except TimeoutError:
        process.kill()
        out, err = await process.communicate()
        raise AssertionError(f"superagent say hung; stdout {out!r}, stderr {err!r}") from None
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def worker_report(pool: asyncpg.Pool, thread: str, ticket_id: str, text: str) -> None:
    """A ticket's ready report on the conversation ``thread``, its home thread."""
    async with pool.acquire() as conn:
        thread_id = await conn.fetchval("SELECT id FROM threads WHERE external_id = $1", thread)
        await routing.worker_report(
            conn,
            report_id=new_id("rpt"),
            ticket_id=ticket_id,
            thread_id=thread_id,
            kind="report.ready",
            text=text,
        )


async def answer_when_said(pool: asyncpg.Pool, channels: Channels, said: str, text: str) -> None:
    """The agent's side: wait for the trigger, then reply on its conversation."""

    async def said_row() -> asyncpg.Record | None:
        rows = [row for row in await web_triggers(pool) if row["text"] == said]
        return rows[0] if rows else None

    row = await assert_eventually(said_row, timeout=30, message=f"trigger {said!r}")
    await reply(pool, channels, row["thread"], text)


async def test_superagent_say_prints_the_reply_and_continues_a_conversation(
    pool: asyncpg.Pool, database_url: str, console_policy: None
) -> None:
    async with serving(pool, database_url) as served:
        agent = asyncio.create_task(
            answer_when_said(pool, served.channels, "Is main green?", "Yes, all 212 passed.")
        )
        code, out, err = await superagent_say("--url", served.url, "Is main green?")
        await agent
        assert (code, out) == (0, "Yes, all 212 passed.\n"), err
        [row] = await web_triggers(pool)
        thread = row["thread"]
        assert f"--conversation {thread}" in err

        agent = asyncio.create_task(
            answer_when_said(pool, served.channels, "And the nightly?", "It failed at 03:12.")
        )
        code, out, err = await superagent_say(
            "--url", served.url, "--thread", thread, "--json", "And the nightly?"
        )
        await agent
        assert code == 0, err
        result = json.loads(out)
        assert (result["thread"], result["verdict"], result["route"]) == (
            thread,
            "explicit",
            "router",
        )
        # Only the reply to this message, not the conversation's earlier one.
        assert [r["text"] for r in result["replies"]] == ["It failed at 03:12."]

        code, out, err = await superagent_say("--url", served.url, "--no-wait", "fire and forget")
        assert (code, out) == (0, ""), err
        assert "conversation chat_" in err
        assert len(await web_triggers(pool)) == 3


async def test_superagent_say_explains_each_failure_in_one_line(
    pool: asyncpg.Pool, database_url: str, console_policy: None
) -> None:
    nobody = f"http://127.0.0.1:{free_port()}"
    code, out, err = await superagent_say("--url", nobody, "hello?")
    assert code == 1
    assert "not running" in err
    assert nobody in err
    assert "Traceback" not in err
    assert out == ""

    async with serving(pool, database_url, token=TOKEN) as served:
        code, _, err = await superagent_say(
            "--url", served.url, "hello", env=cli_env(SUPERAGENT_ADMIN_TOKEN="wrong-token")
        )
        assert code == 1
        assert "refused the admin token" in err
        assert "wrong-token" not in err
        no_token = cli_env(SUPERAGENT_ADMIN_TOKEN="")
        code, _, err = await superagent_say("--url", served.url, "hello", env=no_token)
        assert code == 1
        assert "needs its admin token" in err
        assert await web_triggers(pool) == []

        with_token = cli_env(SUPERAGENT_ADMIN_TOKEN=TOKEN)
        code, _, err = await superagent_say(
            "--url", served.url, "--wait", "0.5", "anyone there?", env=with_token
        )
        assert code == 1
        assert "no reply within 0.5s" in err
        assert "Traceback" not in err

        code, _, err = await superagent_say(
            "--url", served.url, "--thread", "chat_0000000000000000", "hi", env=with_token
        )
        assert code == 1
        assert "no conversation chat_0000000000000000" in err


async def test_superagent_say_says_when_the_policy_will_not_act(
    pool: asyncpg.Pool, database_url: str, db: Any
) -> None:
    # A policy that no longer allowlists the console: chat messages are not requests.
    await save_policy(db, Admission(sources={}))
    async with serving(pool, database_url) as served:
        code, _, err = await superagent_say("--url", served.url, "do something")
        assert code == 1
        assert "will not act" in err
        assert "not allowlisted" in err
        [row] = await web_triggers(pool)
        assert row["route"] == "dropped"


async def test_superagent_say_help_teaches_with_an_example() -> None:
    code, out, _ = await superagent_say("--help")
    assert code == 0
    assert 'superagent say "' in out
    assert "--conversation" in out
    assert "--thread" not in out  # the old name still works, and is not taught
    assert "--no-wait" in out


async def test_the_page_renders_the_agents_markdown_as_text_built_nodes_and_a_report_apart(
    pool: asyncpg.Pool, database_url: str, console_policy: None
) -> None:
    """The chat once showed the agent's Markdown raw, and a ticket's report as if the person
    had said it. Markdown now renders, from text nodes only: markup in a message stays
    text."""
    from playwright.async_api import expect

    from tests.support.console_browser import chromium

    answer = (
        "Run `make test` first:\n```sh\nmake test\n```\n**Done**, see "
        "https://example.com/ci/7 or [the PR](https://example.com/pr/8). "
        "<img src=x onerror=alert(1)><script>alert(2)</script> [x](javascript:alert(3))"
    )
    async with serving(pool, database_url) as served:
        async with connect(served.ws_url + "?name=carol") as ws:
            await ready(ws)
            await say(ws, "How do I check **this**?")
            thread = (await recv(ws))["thread"]
            await recv(ws)  # own message
            await reply(pool, served.channels, thread, answer)
            await worker_report(pool, thread, "tkt_000000000002", "READY: `checked`")
        async with chromium() as browser:
            page = await browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("dialog", lambda dialog: errors.append(f"dialog: {dialog.message}"))
            # The console's sign-in, which leads back to the chat.
            await page.goto(f"{served.url}/chat")
            await page.fill("input[name=token]", TOKEN)
            await page.click("button[type=submit]")
            await expect(page.locator("#status")).to_contain_text("connected")
            await page.goto(f"{served.url}/chat#{thread}")
            agent = page.locator(".msg.agent")
            await expect(agent).to_have_count(1)
            await expect(agent.locator("pre code")).to_have_text("make test")
            await expect(agent.locator(":scope > code")).to_have_text("make test")
            await expect(agent.locator("strong")).to_have_text("Done")
            links = agent.locator("a")
            await expect(links).to_have_count(2)
            assert await links.nth(0).get_attribute("href") == "https://example.com/ci/7"
            assert await links.nth(1).get_attribute("href") == "https://example.com/pr/8"
            await expect(links.nth(1)).to_have_text("the PR")
            # Markup in a message is text: no element made, nothing run, shown as written.
            await expect(page.locator("#messages img, #messages script")).to_have_count(0)
            await expect(agent).to_contain_text("<script>alert(2)</script>")
            await expect(agent).to_contain_text("[x](javascript:alert(3))")
            # What the person typed stays as typed; the report is the worker's, apart.
            await expect(page.locator(".msg.person")).to_contain_text("How do I check **this**?")
            worker = page.locator(".msg.worker")
            await expect(worker).to_contain_text("worker of tkt_000000000002")
            await expect(worker.locator("code")).to_have_text("checked")
            assert errors == []
