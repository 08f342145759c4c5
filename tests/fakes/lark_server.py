"""Fake Feishu/Lark open platform for tests (owned by the test suite, not the product).

``FakeLark`` is a real HTTP + websocket server on ``127.0.0.1`` (ephemeral port), run by
uvicorn on a background thread with its own event loop. Point ``LarkSettings.domain`` at
``fake.url``. It speaks what the channel uses, in Lark's shapes:

* ``POST /open-apis/auth/v3/tenant_access_token/internal``: checks the app id and secret,
  issues ``t-<n>`` tokens valid ``token_expire`` seconds (``revoke_tokens()`` makes every
  issued token invalid: the next call gets code 99991663);
* ``GET /open-apis/bot/v3/info``, ``GET /open-apis/contact/v3/users/{open_id}`` and
  ``POST /open-apis/contact/v3/users/batch_get_id`` (emails → open_ids, from ``emails``;
  code 99991672, "no scope", unless ``contact_scope``);
* ``POST /open-apis/im/v1/messages/{id}/reply``: a reply is recorded once per ``uuid``, as
  Lark does (a repeated uuid answers the first message's id);
* ``POST /open-apis/im/v1/messages/{id}/reactions``;
* ``fail_next(...)`` queues an error answer (status, code, headers) for the next API call;
* the long connection: ``POST /callback/ws/endpoint`` hands out ``ws://.../ws`` with the
  client configuration, and ``/ws`` speaks Lark's frame protocol (protobuf ``pbbp2.Frame``:
  data frames carry events, the client answers each with ``{"code": 200}`` in the same
  frame; control frames are pings and pongs). ``push_event()`` sends an event over it.

Also what Lark does to callback bodies: :func:`encrypt` (AES-256-CBC, key SHA-256 of the
encrypt key, random IV in front, PKCS7, base64) and :func:`sign` (``X-Lark-Signature``),
written independently of the product's decryption.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import hashlib
import itertools
import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives import padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from lark_oapi.ws.pb.pbbp2_pb2 import Frame
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from tests.fakes.loopback import LoopbackFake, LoopbackServer

APP_ID = "cli_fake_app"
APP_SECRET = "fake-app-secret-3141"
BOT_OPEN_ID = "ou_bot0000000000000000000000000000"
BOT_NAME = "Superagent"
SERVICE_ID = 7
_DATA, _CONTROL = 1, 0


def encrypt(encrypt_key: str, plaintext: bytes, iv: bytes | None = None) -> str:
    """What Lark puts in ``{"encrypt": ...}``."""
    iv = iv or os.urandom(16)
    padder = padding.PKCS7(128).padder()
    padded = padder.update(plaintext) + padder.finalize()
    key = hashlib.sha256(encrypt_key.encode()).digest()
    cipher = Cipher(algorithms.AES(key), modes.CBC(iv)).encryptor()
    return base64.b64encode(iv + cipher.update(padded) + cipher.finalize()).decode()


def sign(
    encrypt_key: str, body: bytes, timestamp: str | None = None, nonce: str = "n0nce"
) -> dict[str, str]:
    """The headers Lark signs a callback with (sent now, unless ``timestamp`` says when)."""
    if timestamp is None:
        timestamp = str(int(time.time()))
    digest = hashlib.sha256((timestamp + nonce + encrypt_key).encode() + body).hexdigest()
    return {
        "X-Lark-Request-Timestamp": timestamp,
        "X-Lark-Request-Nonce": nonce,
        "X-Lark-Signature": digest,
    }


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    token: str | None  # the bearer token it carried
    body: Any


@dataclass
class Failure:
    path_contains: str
    status: int
    code: int
    msg: str
    headers: dict[str, str] = field(default_factory=dict)


class FakeLark(LoopbackFake):
    """See the module docstring. Use as ``with FakeLark() as lark: ...``."""

    def __init__(self, *, token_expire: int = 7200) -> None:
        self.host = "127.0.0.1"
        self.token_expire = token_expire
        self.contact_scope = True
        self.users: dict[str, str] = {}  # open_id -> display name
        self.emails: dict[str, str] = {}  # email -> open_id
        self.calls: list[Call] = []
        self.replies: list[dict[str, Any]] = []  # one per uuid: {"message_id", "to", "body"}
        self.reactions: list[dict[str, Any]] = []
        self.token_requests = 0
        self.ws_connections = 0
        self._lock = threading.Lock()
        self._tokens: set[str] = set()
        self._ids = itertools.count(1)
        self._failures: list[Failure] = []
        self._ws: WebSocket | None = None
        self._ws_ready = threading.Event()
        self._answers: dict[str, concurrent.futures.Future[dict[str, Any]]] = {}
        self._app = Starlette(
            routes=[
                Route(
                    "/open-apis/auth/v3/tenant_access_token/internal", self._token, methods=["POST"]
                ),
                Route("/open-apis/bot/v3/info", self._bot_info, methods=["GET"]),
                Route(
                    "/open-apis/contact/v3/users/batch_get_id", self._batch_get_id, methods=["POST"]
                ),
                Route("/open-apis/contact/v3/users/{user_id}", self._user, methods=["GET"]),
                Route(
                    "/open-apis/im/v1/messages/{message_id}/reply", self._reply, methods=["POST"]
                ),
                Route(
                    "/open-apis/im/v1/messages/{message_id}/reactions",
                    self._react,
                    methods=["POST"],
                ),
                Route("/callback/ws/endpoint", self._ws_endpoint, methods=["POST"]),
                WebSocketRoute("/ws", self._ws_session),
            ]
        )
        self._http = LoopbackServer(
            self._app, name="FakeLark", host=self.host, websockets=True, graceful_shutdown=1
        )

    # ---------------------------------------------------------------- lifecycle

    @property
    def url(self) -> str:
        return self._http.url

    # ---------------------------------------------------------------- scripting

    def fail_next(
        self,
        path_contains: str,
        *,
        status: int,
        code: int,
        msg: str = "scripted failure",
        headers: dict[str, str] | None = None,
    ) -> None:
        with self._lock:
            self._failures.append(Failure(path_contains, status, code, msg, headers or {}))

    def revoke_tokens(self) -> None:
        with self._lock:
            self._tokens.clear()

    def api_calls(self, path_contains: str) -> list[Call]:
        with self._lock:
            return [call for call in self.calls if path_contains in call.path]

    # ---------------------------------------------------------------- long connection

    @property
    def ws_connected(self) -> bool:
        return self._ws_ready.is_set()

    def push_event(self, event: dict[str, Any]) -> concurrent.futures.Future[dict[str, Any]]:
        """Send ``event`` over the long connection; the future is the client's answer."""
        if self._ws is None:
            raise RuntimeError("no long connection is open")
        message_id = f"ws-msg-{next(self._ids)}"
        answer: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()
        with self._lock:
            self._answers[message_id] = answer
        frame = Frame()
        frame.SeqID = 0
        frame.LogID = 0
        frame.service = SERVICE_ID
        frame.method = _DATA
        for key, value in (
            ("type", "event"),
            ("message_id", message_id),
            ("trace_id", f"trace-{message_id}"),
            ("sum", "1"),
            ("seq", "0"),
        ):
            header = frame.headers.add()
            header.key, header.value = key, value
        frame.payload = json.dumps(event).encode()
        asyncio.run_coroutine_threadsafe(
            self._ws.send_bytes(frame.SerializeToString()), self._http.loop
        )
        return answer

    def push_raw(self, data: bytes) -> None:
        """Send ``data`` as it is, as one binary frame of the long connection (hostile tests)."""
        if self._ws is None:
            raise RuntimeError("no long connection is open")
        asyncio.run_coroutine_threadsafe(self._ws.send_bytes(data), self._http.loop).result(5)

    def drop_connection(self) -> None:
        """Close the long connection from the server's side."""
        if self._ws is not None:
            asyncio.run_coroutine_threadsafe(self._ws.close(), self._http.loop).result(5)

    async def _ws_endpoint(self, request: Request) -> JSONResponse:
        body = await request.json()
        if body.get("AppID") != APP_ID or body.get("AppSecret") != APP_SECRET:
            return JSONResponse({"code": 1000040343, "msg": "app id or secret is wrong"})
        url = f"ws://{self.host}:{self._http.port}/ws?device_id=fake-device&service_id={SERVICE_ID}"
        config = {
            "ReconnectCount": -1,
            "ReconnectInterval": 1,
            "ReconnectNonce": 0,
            "PingInterval": 120,
        }
        return JSONResponse({"code": 0, "msg": "ok", "data": {"URL": url, "ClientConfig": config}})

    async def _ws_session(self, websocket: WebSocket) -> None:
        await websocket.accept()
        self._ws = websocket
        with self._lock:
            self.ws_connections += 1
        self._ws_ready.set()
        try:
            while True:
                frame = Frame()
                frame.ParseFromString(await websocket.receive_bytes())
                headers = {h.key: h.value for h in frame.headers}
                if frame.method == _CONTROL and headers.get("type") == "ping":
                    pong = Frame()
                    pong.CopyFrom(frame)
                    del pong.headers[:]
                    header = pong.headers.add()
                    header.key, header.value = "type", "pong"
                    await websocket.send_bytes(pong.SerializeToString())
                elif frame.method == _DATA:
                    with self._lock:
                        answer = self._answers.pop(headers.get("message_id", ""), None)
                    if answer is not None:
                        answer.set_result(json.loads(frame.payload))
        except (WebSocketDisconnect, RuntimeError):
            pass
        finally:
            if self._ws is websocket:
                self._ws = None
                self._ws_ready.clear()

    # ---------------------------------------------------------------- open API

    async def _record(self, request: Request) -> tuple[str | None, Any, JSONResponse | None]:
        """The call's token and body, and the error answer it gets, if any."""
        auth = request.headers.get("authorization", "")
        token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None
        raw = await request.body()
        body = json.loads(raw) if raw else None
        path = request.url.path
        with self._lock:
            self.calls.append(Call(request.method, path, token, body))
            failure = next((f for f in self._failures if f.path_contains in path), None)
            if failure is not None:
                self._failures.remove(failure)
            valid = token in self._tokens
        if failure is not None:
            return (
                token,
                body,
                JSONResponse(
                    {"code": failure.code, "msg": failure.msg},
                    status_code=failure.status,
                    headers=failure.headers,
                ),
            )
        if not valid:
            return (
                token,
                body,
                JSONResponse(
                    {"code": 99991663, "msg": "Invalid access token for authorization."},
                    status_code=400,
                ),
            )
        return token, body, None

    async def _token(self, request: Request) -> JSONResponse:
        body = await request.json()
        with self._lock:
            self.token_requests += 1
        if body.get("app_id") != APP_ID or body.get("app_secret") != APP_SECRET:
            return JSONResponse({"code": 10014, "msg": "app secret invalid"}, status_code=400)
        token = f"t-{next(self._ids)}"
        with self._lock:
            self._tokens.add(token)
        return JSONResponse(
            {"code": 0, "msg": "ok", "tenant_access_token": token, "expire": self.token_expire}
        )

    async def _bot_info(self, request: Request) -> JSONResponse:
        _, _, error = await self._record(request)
        if error is not None:
            return error
        bot = {
            "activate_status": 2,
            "app_name": BOT_NAME,
            "avatar_url": "",
            "ip_white_list": [],
            "open_id": BOT_OPEN_ID,
        }
        return JSONResponse({"code": 0, "msg": "ok", "bot": bot})

    async def _user(self, request: Request) -> JSONResponse:
        _, _, error = await self._record(request)
        if error is not None:
            return error
        if not self.contact_scope:
            return _missing_scope("contact:user.base:readonly")
        open_id = request.path_params["user_id"]
        name = self.users.get(open_id)
        if name is None:
            return JSONResponse({"code": 41050, "msg": "no user authority error"}, status_code=400)
        return JSONResponse(
            {"code": 0, "msg": "success", "data": {"user": {"open_id": open_id, "name": name}}}
        )

    async def _batch_get_id(self, request: Request) -> JSONResponse:
        _, body, error = await self._record(request)
        if error is not None:
            return error
        if not self.contact_scope:
            return _missing_scope("contact:user.id:readonly")
        if request.query_params.get("user_id_type", "open_id") != "open_id":
            return JSONResponse({"code": 99992402, "msg": "field validation failed"}, 400)
        found = []
        for email in (body or {}).get("emails") or []:
            open_id = self.emails.get(str(email).lower())
            # Lark lists an email it cannot match without a user_id.
            found.append({"email": email, **({"user_id": open_id} if open_id else {})})
        return JSONResponse({"code": 0, "msg": "success", "data": {"user_list": found}})

    async def _reply(self, request: Request) -> JSONResponse:
        _, body, error = await self._record(request)
        if error is not None:
            return error
        target = request.path_params["message_id"]
        with self._lock:
            earlier = next(
                (r for r in self.replies if r["body"].get("uuid") == body.get("uuid")), None
            )
            if earlier is None:
                earlier = {"message_id": f"om_reply_{next(self._ids)}", "to": target, "body": body}
                self.replies.append(earlier)
        data = {
            "message_id": earlier["message_id"],
            "root_id": target,
            "parent_id": target,
            "msg_type": body.get("msg_type"),
            "body": {"content": body.get("content")},
        }
        return JSONResponse({"code": 0, "msg": "success", "data": data})

    async def _react(self, request: Request) -> JSONResponse:
        _, body, error = await self._record(request)
        if error is not None:
            return error
        with self._lock:
            reaction = {"message_id": request.path_params["message_id"], "body": body}
            self.reactions.append(reaction)
        data = {
            "reaction_id": f"r-{len(self.reactions)}",
            "reaction_type": body.get("reaction_type"),
            "operator": {"operator_id": BOT_OPEN_ID, "operator_type": "app"},
        }
        return JSONResponse({"code": 0, "msg": "success", "data": data})


def _missing_scope(scope: str) -> JSONResponse:
    """Lark's answer to a call the app's granted scopes do not cover."""
    return JSONResponse(
        {
            "code": 99991672,
            "msg": f"Access denied. One of the following scopes is required: [{scope}]",
        },
        status_code=400,
    )
