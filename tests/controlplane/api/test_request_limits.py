"""Bounded requests, played by an attacker with no credentials.

* HTTP: a real `superagent serve` process with every channel that has an HTTP endpoint
  configured. A raw-socket client (the test's eyes on the wire) sends 40 MiB bodies, with a
  Content-Length and chunked without one, to every route the app has (read from the app, so
  a new route is covered without anyone listing it), reads the answer while it sends, and
  the server's memory is read from ``/proc/PID/status`` before and after. Request heads and
  websocket messages are bounded too.
* Pairing: bursts of concurrent wrong codes over real gRPC are counted exactly; per-peer
  grouping (IPv6 /64, IPv4-mapped addresses) and the global rate go through the gateway's
  servicer with a stand-in for the gRPC call context, because this machine cannot dial from
  many source addresses (the one edge faked; everything behind it is real).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import secrets
import socket
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import asyncpg
import grpc
import pytest
from fastapi.routing import iter_route_contexts
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from starlette.types import Message, Receive, Scope, Send
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from controlplane.api.app import create_app
from controlplane.db import migrate
from controlplane.db.urls import asyncpg_dsn
from controlplane.gateway.pairing import CODE_ALPHABET
from controlplane.gateway.server import EndpointGateway
from controlplane.settings import GrpcSettings, HttpSettings, Settings
from controlplane.web.state import AppState
from superagent_proto.v1 import endpoint_pb2 as pb
from superagent_shared.protocol import PROTOCOL_VERSION_NUMBER
from tests.support.database import with_database
from tests.support.gateway_harness import FakeDevice, Gateway, running_gateway
from tests.support.helpers import assert_eventually, free_port
from tests.support.replica_process import ReplicaProcess

MiB = 1 << 20
ATTACK = 40 * MiB
DEFAULT_CAP = 1 * MiB
ROUTE_CAPS = {"/webhooks/github": 25 * MiB, "/webhooks/slack": 1 * MiB, "/webhooks/lark": 1 * MiB}
# What the server may grow by while it refuses every 40 MiB body: far less than one body.
MEMORY_SLACK_KIB = 12 * 1024
TOKEN = "request-limits-admin-token-0123456789abcdef"  # configured; never sent by the attacker
BLOCK = b"x" * (64 << 10)


# -- the server -----------------------------------------------------------------------------


@dataclass
class Server:
    replica: ReplicaProcess
    port: int

    @property
    def pid(self) -> int:
        assert self.replica.process is not None
        return self.replica.process.pid

    def memory(self) -> tuple[int, int]:
        """(VmRSS, VmHWM) in KiB: the resident set now, and its peak so far."""
        fields: dict[str, int] = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0])
        return fields["VmRSS"], fields["VmHWM"]


@contextlib.asynccontextmanager
async def serving(database: str, state: Path) -> AsyncIterator[Server]:
    """`superagent serve` on ``database`` (empty), with GitHub, Slack, Lark and the web chat
    on; its state and log under ``state``."""
    await migrate.upgrade(database)
    port = free_port()
    nowhere = "http://127.0.0.1:9"  # no outbound call is needed; none may reach the internet
    env = {
        **os.environ,
        "DATABASE_URL": database,
        "SUPERAGENT_STATE_DIR": str(state / "state"),
        "SUPERAGENT_HTTP__PORT": str(port),
        "SUPERAGENT_GRPC__PORT": str(free_port()),
        "SUPERAGENT_ADMIN_TOKEN": TOKEN,
        "SUPERAGENT_GITHUB__WEBHOOK_SECRET": "github-webhook-secret",
        "SUPERAGENT_GITHUB__API_URL": nowhere,
        "SUPERAGENT_SLACK__BOT_TOKEN": "xoxb-request-limits",
        "SUPERAGENT_SLACK__SIGNING_SECRET": "slack-signing-secret",
        "SUPERAGENT_SLACK__API_URL": nowhere,
        "SUPERAGENT_LARK__APP_ID": "cli_request_limits",
        "SUPERAGENT_LARK__APP_SECRET": "lark-app-secret",
        "SUPERAGENT_LARK__VERIFICATION_TOKEN": "lark-verification-token",
        "SUPERAGENT_LARK__DOMAIN": nowhere,
        "SUPERAGENT_WEBCHAT__ENABLED": "true",
    }
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY"):
        env.pop(name, None)
    replica = ReplicaProcess(env, state / "serve.log", port)
    replica.start()
    try:
        await assert_eventually(
            replica.up, timeout=60, message=f"serve answers /readyz (see {replica.log})"
        )
        yield Server(replica, port)
    finally:
        replica.stop()


@pytest.fixture
async def server(empty_database: str, tmp_path: Path) -> AsyncIterator[Server]:
    """A server of the test's own: for the tests that measure its memory, which no earlier
    test may have grown."""
    async with serving(empty_database, tmp_path) as fresh:
        yield fresh


@pytest.fixture(scope="module")
async def shared_server(
    pg_server_url: str, worker_id: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Server]:
    """One server for this module's tests that measure no memory: starting one (a database
    migrated, a process importing everything) is most of what each of them costs."""
    name = f"sa_limits_{worker_id}_{os.getpid()}"
    admin = await asyncpg.connect(asyncpg_dsn(pg_server_url))
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    try:
        state = tmp_path_factory.mktemp("shared-server")
        async with serving(with_database(pg_server_url, name), state) as shared:
            yield shared
    finally:
        admin = await asyncpg.connect(asyncpg_dsn(pg_server_url))
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


def body_routes() -> list[tuple[str, str]]:
    """(method, path) of every HTTP route of the app: the ones that take a body, and one GET.

    Read from the app itself, so a route added later is attacked too. Path parameters get
    a placeholder; the cap must hold before routing anyway.
    """
    state = AppState(
        settings=Settings(),
        # Never awaited, so never connected: the routes are only listed.
        pool=asyncpg.create_pool("postgresql://nobody@127.0.0.1:9/none"),
        replica_id="r",
    )
    found: set[tuple[str, str]] = set()
    for route in iter_route_contexts(create_app(state).routes):
        methods, path = route.methods, route.path
        if not methods or not path:
            continue  # websockets: bounded per message, below
        for method in methods & {"POST", "PUT", "PATCH", "DELETE"}:
            found.add((method, re.sub(r"\{[^}]*\}", "x1", path)))
    assert ("POST", "/webhooks/github") in found, found
    # A cap is not a property of a route: a GET with a body, and no route at all, too.
    found |= {("GET", "/healthz"), ("POST", "/no/such/route")}
    return sorted(found)


def cap_of(path: str) -> int:
    return ROUTE_CAPS.get(path, DEFAULT_CAP)


# -- a client that reads the answer while it sends -----------------------------------------


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    sent: int  # body bytes written before the answer came (or the server hung up)

    def error_code(self) -> str | None:
        try:
            code = json.loads(self.body)["error"]["code"]
        except (ValueError, KeyError, TypeError):
            return None
        return code if isinstance(code, str) else None


def json_body(size: int) -> Iterator[bytes]:
    """A valid JSON object of exactly ``size`` bytes, in pieces of at most 64 KiB."""
    head, tail = b'{"pad": "', b'"}'
    yield head
    left = size - len(head) - len(tail)
    while left > 0:
        piece = BLOCK[: min(len(BLOCK), left)]
        left -= len(piece)
        yield piece
    yield tail


class Wire:
    """One client connection on a raw socket, written and read at the same time.

    Not asyncio streams: when a write meets the server's reset, the stream transport closes
    itself and loses an answer that had already arrived; a socket still gives it.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.loop = asyncio.get_running_loop()

    @classmethod
    async def open(cls, port: int) -> Wire:
        sock = socket.socket()
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        return cls(sock)

    async def write(self, data: bytes) -> bool:
        """Whether ``data`` went out (False: the server hung up)."""
        try:
            await self.loop.sock_sendall(self.sock, data)
        except OSError:  # reset, broken pipe
            return False
        return True

    async def answer(self) -> tuple[int, dict[str, str], bytes]:
        received = b""
        while b"\r\n\r\n" not in received:
            chunk = await self.loop.sock_recv(self.sock, 1 << 16)
            if not chunk:
                raise EOFError(f"the server hung up without an answer (got {received[:200]!r})")
            received += chunk
        head, _, body = received.partition(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines:
            name, colon, value = line.partition(":")
            if colon:
                headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        while len(body) < length:
            chunk = await self.loop.sock_recv(self.sock, 1 << 16)
            if not chunk:
                break
            body += chunk
        return int(status_line.split()[1]), headers, body[:length]

    async def stream(self, pieces: Iterator[bytes], answer: asyncio.Future[Any]) -> int:
        """Write ``pieces`` until the answer arrives or the server stops taking them."""
        sent = 0
        for piece in pieces:
            if answer.done():
                break
            writing = asyncio.ensure_future(self.write(piece))
            await asyncio.wait({writing, answer}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
            if not writing.done():
                writing.cancel()
                break  # the server stopped reading
            if not writing.result():
                break
            sent += len(piece)
        return sent

    def close(self) -> None:
        self.sock.close()


def chunks(pieces: Iterator[bytes]) -> Iterator[bytes]:
    """``pieces`` in chunked transfer encoding."""
    for piece in pieces:
        yield f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    yield b"0\r\n\r\n"


async def send(
    port: int,
    method: str,
    path: str,
    pieces: Iterator[bytes],
    *,
    length: int | None,
    head_extra: bytes = b"",
    answer_timeout: float = 60.0,
) -> Answer:
    """Send a request piece by piece (chunked when ``length`` is None); stop at the answer."""
    wire = await Wire.open(port)
    try:
        framing = "Transfer-Encoding: chunked" if length is None else f"Content-Length: {length}"
        answer = asyncio.ensure_future(wire.answer())
        await wire.write(
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\n{framing}\r\n".encode()
            + head_extra
            + b"\r\n"
        )
        sent = await wire.stream(pieces if length is not None else chunks(pieces), answer)
        try:
            status, headers, body = await asyncio.wait_for(answer, answer_timeout)
        finally:
            answer.cancel()
    finally:
        wire.close()
    return Answer(status, headers, body, sent)


async def send_body(port: int, method: str, path: str, size: int, *, chunked: bool) -> Answer:
    return await send(port, method, path, json_body(size), length=None if chunked else size)


async def warm_up(server: Server, routes: list[tuple[str, str]]) -> None:
    """Every route once with a small body (lazy imports, first-use caches), and one refusal."""
    for method, path in routes:
        await send_body(server.port, method, path, 100, chunked=False)
    await send_body(server.port, "POST", "/healthz", 2 * MiB, chunked=False)


# -- HTTP bodies --------------------------------------------------------------------------


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_a_40_mib_body_to_any_route_gets_413_and_memory_stays_flat(
    server: Server, chunked: bool
) -> None:
    routes = body_routes()
    await warm_up(server, routes)
    wrong: list[str] = []

    async def attack(method: str, path: str) -> None:
        answer = await send_body(server.port, method, path, ATTACK, chunked=chunked)
        if answer.status != 413 or answer.error_code() != "too_large":
            wrong.append(f"{method} {path}: {answer.status} {answer.body[:200]!r}")
        elif answer.headers.get("content-type") != "application/json":
            wrong.append(f"{method} {path}: 413 as {answer.headers.get('content-type')}")
        elif cap_of(path) <= 8 * MiB and answer.sent >= ATTACK:
            wrong.append(f"{method} {path}: 413 only after the whole body was sent")

    # The 1 MiB routes first: together they may not grow the server by one cap's worth.
    rss_before, peak_before = server.memory()
    for method, path in routes:
        if cap_of(path) == DEFAULT_CAP:
            await attack(method, path)
    rss_small, peak_small = server.memory()
    grown = {"rss": rss_small - rss_before, "peak": peak_small - peak_before}
    assert not wrong, "\n".join(wrong) + f"\nmemory grew by {grown} KiB"
    assert grown["peak"] < MEMORY_SLACK_KIB, f"memory grew by {grown} KiB"
    assert grown["rss"] < MEMORY_SLACK_KIB, f"memory grew by {grown} KiB"
    # A route with a bigger cap (GitHub's 25 MiB, which must hold a body to check its
    # signature) may be made to hold its cap when the body is streamed, no more.
    for method, path in routes:
        if cap_of(path) > DEFAULT_CAP:
            await attack(method, path)
            _, peak = server.memory()
            allowed = (0 if not chunked else cap_of(path) >> 10) + MEMORY_SLACK_KIB
            assert peak - peak_small < allowed, (path, peak - peak_small, allowed)
    assert not wrong, "\n".join(wrong)
    assert server.replica.alive()


async def test_a_declared_oversize_is_refused_before_one_byte_of_it_is_sent(
    shared_server: Server,
) -> None:
    server = shared_server
    """``Expect: 100-continue``: a client that waits for the go-ahead never has to send."""
    wire = await Wire.open(server.port)
    try:
        await wire.write(
            f"POST /console/api/devices/pair HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {ATTACK}\r\n"
            "Expect: 100-continue\r\n\r\n".encode()
        )
        status, _, body = await asyncio.wait_for(wire.answer(), 10)
    finally:
        wire.close()
    assert status == 413, body
    assert json.loads(body)["error"]["code"] == "too_large"
    assert "1 MB" in json.loads(body)["error"]["message"]


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_each_route_has_its_cap_and_a_body_within_it_reaches_the_route(
    shared_server: Server, chunked: bool
) -> None:
    server = shared_server
    cases = [
        ("/webhooks/github", 25 * MiB),
        ("/webhooks/slack", 1 * MiB),
        ("/webhooks/lark", 1 * MiB),
        ("/console/api/devices/pair", 1 * MiB),
        ("/chat/session", 1 * MiB),
    ]
    for path, cap in cases:
        within = await send_body(server.port, "POST", path, cap, chunked=chunked)
        assert within.status not in (413, 500), (path, within.status, within.body[:300])
        over = await send_body(server.port, "POST", path, cap + 1, chunked=chunked)
        assert over.status == 413, (path, over.status, over.body[:300])
        assert f"{cap // MiB} MB" in json.loads(over.body)["error"]["message"]


# -- request heads ------------------------------------------------------------------------


async def test_an_endless_request_head_gets_431_and_memory_stays_flat(server: Server) -> None:
    await warm_up(server, [("GET", "/healthz")])
    rss_before, peak_before = server.memory()

    def header_bytes() -> Iterator[bytes]:
        yield b"X-Pad: "
        for _ in range(ATTACK // len(BLOCK)):
            yield BLOCK

    wire = await Wire.open(server.port)
    try:
        answer = asyncio.ensure_future(wire.answer())
        await wire.write(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n".encode())
        await wire.stream(header_bytes(), answer)
        status, _, body = await asyncio.wait_for(answer, 10)
    finally:
        wire.close()
    rss_after, peak_after = server.memory()
    assert status == 431, body
    assert json.loads(body)["error"]["code"] == "headers_too_large"
    assert peak_after - peak_before < MEMORY_SLACK_KIB
    assert rss_after - rss_before < MEMORY_SLACK_KIB
    # An ordinary, generous head still passes.
    ok = await send(
        server.port,
        "GET",
        "/healthz",
        iter(()),
        length=0,
        head_extra=b"X-Pad: " + b"y" * 8000 + b"\r\n",
    )
    assert ok.status == 200
    # A head just over the limit that arrives in one piece is measured too.
    over = await send(
        server.port,
        "GET",
        "/healthz",
        iter(()),
        length=0,
        head_extra=b"X-Pad: " + b"y" * (32 << 10) + b"\r\n",
    )
    assert over.status == 431


# -- websocket messages -------------------------------------------------------------------


async def test_an_oversized_websocket_message_closes_the_socket(shared_server: Server) -> None:
    server = shared_server
    """The chat's frames are at most 64 Ki characters; far bigger is refused by the server.

    Signed in (with a header, as scripts do) so that the socket stays open long enough to
    carry a message: the bound is for everyone, credentials or not.
    """
    url = f"ws://127.0.0.1:{server.port}/chat/ws"
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with connect(url, additional_headers=headers, max_size=None) as ws:
        ready = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert ready["type"] == "ready", ready
        # Just over the chat's own limit: judged by the app, and the socket stays usable.
        await ws.send(json.dumps({"type": "say", "text": "x" * (64 * 1024)}))
        judged = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert judged["type"] == "error", judged
        # Four times what any frame the chat accepts can weigh: refused by the server.
        await ws.send("x" * (MiB + 1))
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 10)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1009  # message too big


# -- the middleware on its own ------------------------------------------------------------


def _app_seen() -> tuple[list[Message], Any]:
    seen: list[Message] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append({"type": "app.called"})
        while True:
            try:
                message = await receive()
            except Exception as exc:  # the cap, as the app sees it
                seen.append({"type": "app.refused", "error": type(exc).__name__})
                await send({"type": "http.response.start", "status": 400, "headers": []})
                await send({"type": "http.response.body", "body": b"app's own answer"})
                return
            seen.append(message)
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    return seen, app


async def _call(
    app: Any, path: str, chunks: list[bytes], headers: Mapping[str, str] | None = None
) -> list[Message]:
    pending = [
        {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
        for i, chunk in enumerate(chunks)
    ]
    sent: list[Message] = []

    async def receive() -> Message:
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "headers": [(k.encode(), v.encode()) for k, v in (headers or {}).items()],
    }
    await app(scope, receive, send)
    return sent


async def test_the_cap_answers_before_the_app_and_cuts_a_stream_at_the_limit() -> None:
    from controlplane.api.body_limit import BodyLimit

    settings = HttpSettings(max_body_bytes=4096, github_webhook_max_body_bytes=8192)

    seen, inner = _app_seen()
    sent = await _call(
        BodyLimit(inner, settings=settings), "/x", [b"a"], {"content-length": "4097"}
    )
    assert seen == []  # not called: nothing read the body, no auth ran, no JSON was parsed
    assert sent[0]["status"] == 413
    assert (b"connection", b"close") in sent[0]["headers"]
    error = json.loads(b"".join(m.get("body", b"") for m in sent[1:]))["error"]
    assert error["code"] == "too_large"
    assert "SUPERAGENT_HTTP__MAX_BODY_BYTES" in error["message"]

    seen, inner = _app_seen()
    sent = await _call(BodyLimit(inner, settings=settings), "/x", [b"a" * 2048] * 3)
    assert [m["type"] for m in seen] == [
        "app.called",
        "http.request",
        "http.request",
        "app.refused",
    ]
    assert sent[0]["status"] == 413  # the app's own 400 was dropped
    assert b"app's own answer" not in b"".join(m.get("body", b"") for m in sent)

    seen, inner = _app_seen()
    sent = await _call(BodyLimit(inner, settings=settings), "/webhooks/github", [b"a" * 2048] * 4)
    assert sent[0]["status"] == 204  # 8 KiB: within this route's own cap
    sent = await _call(
        BodyLimit(inner, settings=settings), "/webhooks/github", [b"a"], {"content-length": "8193"}
    )
    assert sent[0]["status"] == 413
    assert (
        "SUPERAGENT_HTTP__GITHUB_WEBHOOK_MAX_BODY_BYTES"
        in json.loads(sent[1]["body"])["error"]["message"]
    )


# -- pairing ------------------------------------------------------------------------------


@pytest.fixture
async def gateway(
    db: async_sessionmaker[AsyncSession], database_url: str, tmp_path: Path
) -> AsyncIterator[Gateway]:
    async with running_gateway(
        database_url, db, tmp_path, grpc_settings={"pairing_failures_per_peer": PER_PEER}
    ) as gw:
        yield gw


async def sql(database_url: str, query: str, *args: object) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        return await conn.fetch(query, *args)
    finally:
        await conn.close()


def random_code() -> str:
    return "".join(secrets.choice(CODE_ALPHABET) for _ in range(8))


async def attempt(gateway: Gateway, code: str) -> grpc.aio.AioRpcError | None:
    try:
        await FakeDevice(gateway).pair(code)
    except grpc.aio.AioRpcError as refused:
        return refused
    return None


def tally(answers: list[grpc.aio.AioRpcError | None]) -> Counter[str]:
    return Counter("paired" if a is None else f"{a.code().name}: {a.details()}" for a in answers)


WRONG = "PERMISSION_DENIED: wrong or unknown pairing code"
PER_PEER = 10  # failed attempts one peer may make per window (the default, set explicitly)


async def test_100_concurrent_wrong_codes_from_one_peer_are_counted_exactly(
    gateway: Gateway, database_url: str
) -> None:
    limit = PER_PEER
    answers = await asyncio.gather(*(attempt(gateway, random_code()) for _ in range(100)))
    counts = tally(list(answers))
    throttled = [k for k in counts if k.startswith("RESOURCE_EXHAUSTED")]
    assert counts[WRONG] == limit, counts  # exactly `limit` codes were ever compared
    assert sum(counts[k] for k in throttled) == 100 - limit, counts
    rows = await sql(
        database_url, "SELECT failures FROM pairing_throttle WHERE source = $1", "127.0.0.1"
    )
    assert [r["failures"] for r in rows] == [100]
    good = await gateway.pairing_code("after-the-burst")
    refused = await attempt(gateway, good)
    assert refused is not None
    assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "wait 10 minutes" in (refused.details() or "")


async def test_100_concurrent_wrong_guesses_at_one_code_are_counted_and_lock_it(
    db: async_sessionmaker[AsyncSession], database_url: str, tmp_path: Path
) -> None:
    # Many peers' worth of attempts: the code's own counter is what is under test here.
    async with running_gateway(
        database_url, db, tmp_path, grpc_settings={"pairing_failures_per_peer": 1000}
    ) as gateway:
        code = (await gateway.pairing_code("target")).replace("-", "")
        guesses: set[str] = set()
        while len(guesses) < 100:  # the lookup half right, the secret half wrong
            guess = code[:4] + "".join(random.choices(CODE_ALPHABET, k=4))
            if guess != code:
                guesses.add(guess)
        answers = await asyncio.gather(*(attempt(gateway, g) for g in guesses))
        assert tally(list(answers)) == {WRONG: 100}  # never a hint that the lookup matched
        rows = await sql(
            database_url,
            "SELECT failed_attempts, used_at, device_id FROM pairing_codes WHERE device_name = $1",
            "target",
        )
        assert len(rows) == 1
        assert rows[0]["failed_attempts"] == 100
        assert rows[0]["used_at"] is not None
        assert rows[0]["device_id"] is None
        refused = await attempt(gateway, code)
        assert refused is not None
        assert refused.code() == grpc.StatusCode.PERMISSION_DENIED
        assert refused.details() == "this pairing code was locked after too many wrong attempts"


class Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class PeerContext:
    """The part of a gRPC call context the Pair servicer reads: the peer, and abort."""

    def __init__(self, peer: str) -> None:
        self._peer = peer

    def peer(self) -> str:
        return self._peer

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise Aborted(code, details)


def servicer(gateway: Gateway, **settings: Any) -> EndpointGateway:
    return EndpointGateway(
        gateway.pool,
        gateway.delivery,
        gateway.hub,
        GrpcSettings.model_validate({"port": 0, "pairing_failures_per_peer": PER_PEER, **settings}),
        gateway.tls,
        "test deployment",
    )


async def pair_from(gateway: EndpointGateway, peer: str, code: str) -> str:
    """``paired``, or the refusal's status and details, for a Pair call from ``peer``."""
    request = pb.PairRequest(
        pairing_code=code,
        public_key=secrets.token_bytes(32),
        daemon_version="test",
        protocol_version=PROTOCOL_VERSION_NUMBER,
    )
    try:
        await gateway.Pair(request, cast(grpc.aio.ServicerContext, PeerContext(peer)))
    except Aborted as refused:
        return f"{refused.code.name}: {refused.details}"
    return "paired"


def ipv6_peer(address: str, port: int) -> str:
    return f"ipv6:%5B{address}%5D:{port}"  # as gRPC writes it: the brackets URI-escaped


async def test_ipv6_peers_are_grouped_per_64_and_mapped_ipv4_is_ipv4(gateway: Gateway) -> None:
    pairing = servicer(gateway)
    for i in range(PER_PEER):  # each from a new address and port in one /64
        assert (
            await pair_from(pairing, ipv6_peer(f"2001:db8:1:2::{i + 1:x}", 4000 + i), random_code())
            == WRONG
        )
    # Another address in the same /64 is the same peer, also unescaped; the next /64 is not.
    same = await pair_from(pairing, "ipv6:[2001:db8:1:2:ffff:ffff:ffff:fffe]:5001", random_code())
    assert same.startswith("RESOURCE_EXHAUSTED"), same
    assert await pair_from(pairing, ipv6_peer("2001:db8:1:3::1", 5002), random_code()) == WRONG

    for i in range(PER_PEER):  # a dual-stack listener sees IPv4 clients as mapped addresses
        assert (
            await pair_from(pairing, ipv6_peer("::ffff:198.51.100.7", 6000 + i), random_code())
            == WRONG
        )
    as_ipv4 = await pair_from(pairing, "ipv4:198.51.100.7:7000", random_code())
    assert as_ipv4.startswith("RESOURCE_EXHAUSTED"), as_ipv4
    assert await pair_from(pairing, "ipv4:198.51.100.8:7001", random_code()) == WRONG


class Ipv6Gateway(Gateway):
    @property
    def target(self) -> str:
        return f"[::1]:{self.port}"


async def test_wrong_codes_over_real_ipv6_are_counted_against_the_peer_not_the_connection(
    db: async_sessionmaker[AsyncSession], database_url: str, tmp_path: Path
) -> None:
    settings = {"host": "::1", "pairing_failures_per_peer": PER_PEER}
    async with running_gateway(database_url, db, tmp_path, grpc_settings=settings) as gw:
        gateway = Ipv6Gateway(gw.port, gw.queue, gw.tls, gw.pool, gw.hub, gw.delivery, gw.streams)
        for _ in range(PER_PEER):  # a new connection, so a new source port, each time
            refused = await attempt(gateway, random_code())
            assert refused is not None
            assert refused.code() == grpc.StatusCode.PERMISSION_DENIED
        refused = await attempt(gateway, random_code())
        assert refused is not None
        assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.details()
    rows = await sql(
        database_url, "SELECT source, failures FROM pairing_throttle WHERE source <> '*'"
    )
    assert {r["source"]: r["failures"] for r in rows} == {"::/64": PER_PEER + 1}


async def test_a_global_rate_bounds_guesses_spread_over_many_peers(
    gateway: Gateway, database_url: str
) -> None:
    pairing = servicer(gateway, pairing_failures_global=30)
    for i in range(30):  # one guess each from 30 addresses: under every peer's own limit
        assert await pair_from(pairing, f"ipv4:203.0.113.{i + 1}:4000", random_code()) == WRONG
    fresh = await pair_from(pairing, "ipv4:192.0.2.1:4000", random_code())
    assert fresh.startswith("RESOURCE_EXHAUSTED"), fresh
    assert "from all addresses" in fresh
    # Even the right code waits: nothing is compared once the deployment-wide budget is spent.
    good = await gateway.pairing_code("during-the-spray")
    assert (await pair_from(pairing, "ipv4:192.0.2.2:4000", good)).startswith("RESOURCE_EXHAUSTED")


async def test_a_successful_pairing_is_not_counted_as_a_failure(
    gateway: Gateway, database_url: str
) -> None:
    pairing = servicer(gateway)
    for _ in range(3):
        assert await pair_from(pairing, "ipv4:198.51.100.20:4000", random_code()) == WRONG
    good = await gateway.pairing_code("counted-right")
    assert await pair_from(pairing, "ipv4:198.51.100.20:4000", good) == "paired"
    rows = await sql(database_url, "SELECT source, failures FROM pairing_throttle ORDER BY source")
    assert {r["source"]: r["failures"] for r in rows}.get("198.51.100.20") == 3


def test_the_limits_are_described_settings() -> None:
    fields = {**HttpSettings.model_fields, **GrpcSettings.model_fields}
    for name in (
        "max_body_bytes",
        "github_webhook_max_body_bytes",
        "slack_webhook_max_body_bytes",
        "lark_webhook_max_body_bytes",
        "max_header_bytes",
        "ws_max_message_bytes",
        "pairing_failures_per_peer",
        "pairing_failures_global",
        "max_streams",
        "max_streams_per_peer",
    ):
        assert fields[name].description, name
