"""A fake Slack for tests: the Web API methods the adapter calls, and Socket Mode.

This module owns ``FakeSlack``, a real HTTP server on ``127.0.0.1`` (ephemeral port), run by
uvicorn in a background thread with its own event loop (like ``openai_server``):

* Web API at ``{url}/api/{method}``: ``auth.test``, ``users.info``, ``users.list``,
  ``users.lookupByEmail``, ``usergroups.list``, ``chat.postMessage``,
  ``conversations.replies``, ``reactions.add``, ``apps.connections.open``. Slack's wire
  habits: HTTP 200 with ``{"ok": false, "error": ...}`` for failures; bearer tokens
  checked (``not_authed``, ``invalid_auth``, ``not_allowed_token_type``: the app-level
  token only opens connections); form or query arguments everywhere, JSON bodies only on
  write methods; cursor pagination (``response_metadata.next_cursor``); message metadata
  returned only with ``include_all_metadata``.
* Failure injection (:meth:`FakeSlack.fail_next`): a 429 with ``Retry-After``, a 5xx, an
  ``ok: false`` error, optionally after the call took effect (a response lost on the way).
* Socket Mode: ``apps.connections.open`` hands out single-use ``ws://.../link/?ticket=``
  URLs; a connection gets ``hello``; :meth:`push` sends an ``events_api`` envelope,
  :meth:`disconnect` a ``disconnect`` message followed by a close; acknowledgements
  (``{"envelope_id": ...}``) are recorded in :attr:`acks`.
* :meth:`say` records a person's message in a channel and returns the ``event_callback``
  body Slack would deliver for it. ``team=`` makes it a Slack Connect message from another
  organisation's member (``team``, ``user_team`` and ``source_team`` name their workspace,
  and the channel is externally shared), as Slack delivers those.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import threading
import time
import urllib.parse
import uuid
from collections import deque
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from tests.fakes.loopback import LoopbackFake, LoopbackServer

BOT_TOKEN = "xoxb-fake-bot-token-4411"
APP_TOKEN = "xapp-1-fake-app-token-4411"
TEAM_ID = "T0FAKE"
APP_ID = "A0FAKE"
BOT_USER = "U0AGENT"
BOT_ID = "B0AGENT"

_WRITE_METHODS = frozenset({"chat.postMessage", "reactions.add"})


@dataclass
class Failure:
    status: int = 200
    error: str | None = None
    retry_after: int | None = None
    after_effect: bool = False  # the call takes effect, then its answer fails
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Call:
    method: str
    token: str | None
    args: dict[str, Any]


@dataclass
class Channel:
    id: str
    bot_member: bool = True
    messages: list[dict[str, Any]] = field(default_factory=list)


class FakeSlack(LoopbackFake):
    def __init__(self, *, host: str = "127.0.0.1") -> None:
        self.host = host
        self.users: dict[str, dict[str, Any]] = {}
        self.usergroups: list[dict[str, Any]] = []
        self.channels: dict[str, Channel] = {}
        self.calls: list[Call] = []
        self.acks: list[str] = []
        self.connections_opened = 0
        self.page_size_cap = 1000  # lower it to force pagination
        self._failures: dict[str, deque[Failure]] = {}
        self._tickets: set[str] = set()
        self._sockets: list[WebSocket] = []
        self._ts = itertools.count(1)
        self._events = itertools.count(1)
        self._lock = threading.Lock()
        self._app = Starlette(
            routes=[
                Route("/api/{method}", self._api, methods=["GET", "POST"]),
                WebSocketRoute("/link/", self._socket),
            ]
        )
        self._http = LoopbackServer(
            self._app, name="FakeSlack", host=host, websockets=True, graceful_shutdown=1
        )
        self.add_user(BOT_USER, "superagent", is_bot=True)

    # ---------------------------------------------------------------- lifecycle

    @property
    def url(self) -> str:
        """Give ``{url}/api`` to the adapter as ``SUPERAGENT_SLACK__API_URL``."""
        return self._http.url

    @property
    def api_url(self) -> str:
        return f"{self.url}/api"

    def stop(self, timeout: float = 5.0) -> None:
        self._http.stop(timeout)

    # ---------------------------------------------------------------- scripting

    def add_user(
        self,
        user_id: str,
        name: str,
        *,
        is_bot: bool = False,
        team_id: str = TEAM_ID,
        email: str | None = None,
    ) -> None:
        """A member (``team_id``: another organisation's, seen through Slack Connect)."""
        profile: dict[str, Any] = {"display_name": name, "real_name": name.title()}
        if email is not None:
            profile["email"] = email
        self.users[user_id] = {
            "id": user_id,
            "team_id": team_id,
            "name": name,
            "real_name": name.title(),
            "deleted": False,
            "is_bot": is_bot,
            "profile": profile,
        }

    def add_usergroup(self, group_id: str, handle: str, users: list[str]) -> None:
        self.usergroups.append({"id": group_id, "handle": handle, "users": users})

    def add_channel(self, channel_id: str, *, bot_member: bool = True) -> None:
        self.channels[channel_id] = Channel(channel_id, bot_member=bot_member)

    def fail_next(self, method: str, failure: Failure) -> None:
        with self._lock:
            self._failures.setdefault(method, deque()).append(failure)

    def say(
        self,
        channel: str,
        user: str,
        text: str,
        *,
        event_type: str = "app_mention",
        channel_type: str | None = None,
        thread_ts: str | None = None,
        bot_id: str | None = None,
        subtype: str | None = None,
        team: str = TEAM_ID,
    ) -> dict[str, Any]:
        """Record ``user``'s message and return the ``event_callback`` Slack sends for it.

        ``team`` is the author's workspace; another one than ours is a Slack Connect
        message."""
        ts = self._next_ts()
        message: dict[str, Any] = {"type": "message", "user": user, "text": text, "ts": ts}
        if thread_ts:
            message["thread_ts"] = thread_ts
        if bot_id:
            message["bot_id"] = bot_id
        if subtype:
            message["subtype"] = subtype
        with self._lock:
            self.channels.setdefault(channel, Channel(channel)).messages.append(message)
        event: dict[str, Any] = {
            **{k: v for k, v in message.items() if k != "type"},
            "type": event_type,
            "channel": channel,
            "event_ts": ts,
            "team": team,
        }
        if team != TEAM_ID:
            event.update(user_team=team, source_team=team)
        if event_type == "message":
            event["channel_type"] = channel_type or _channel_type(channel)
        return self.callback(event, shared=team != TEAM_ID)

    def callback(self, event: dict[str, Any], *, shared: bool = False) -> dict[str, Any]:
        """``event`` wrapped as Slack wraps events (an ``event_callback`` body); ``shared``:
        in a channel shared with another organisation."""
        return {
            "token": "legacy-verification-token",
            "team_id": TEAM_ID,
            "api_app_id": APP_ID,
            "event": event,
            "type": "event_callback",
            "event_id": f"Ev{next(self._events):08d}",
            "event_time": int(time.time()),
            "authorizations": [
                {"team_id": TEAM_ID, "user_id": BOT_USER, "is_bot": True, "enterprise_id": None}
            ],
            "is_ext_shared_channel": shared,
        }

    def thread(self, channel: str, ts: str) -> list[dict[str, Any]]:
        with self._lock:
            messages = list(self.channels[channel].messages)
        return [m for m in messages if m["ts"] == ts or m.get("thread_ts") == ts]

    def calls_to(self, method: str) -> list[Call]:
        with self._lock:
            return [call for call in self.calls if call.method == method]

    @property
    def open_sockets(self) -> int:
        with self._lock:
            return len(self._sockets)

    def push(self, payload: dict[str, Any], *, retry_attempt: int = 0) -> str:
        """Send ``payload`` as an ``events_api`` envelope on the newest connection."""
        envelope_id = str(uuid.uuid4())
        envelope = {
            "envelope_id": envelope_id,
            "payload": payload,
            "type": "events_api",
            "accepts_response_payload": False,
            "retry_attempt": retry_attempt,
            "retry_reason": "timeout" if retry_attempt else "",
        }
        self._on_server_loop(self._send_newest(envelope))
        return envelope_id

    def push_raw(self, text: str) -> None:
        """Send ``text`` as it is, as one frame on the newest connection (hostile tests)."""
        self._on_server_loop(self._send_newest_text(text))

    def disconnect(self, reason: str = "refresh_requested") -> None:
        """Slack's connection refresh: a ``disconnect`` message, then the socket closes."""
        self._on_server_loop(self._disconnect(reason))

    # ---------------------------------------------------------------- Socket Mode

    def _on_server_loop(self, coro: Coroutine[Any, Any, None]) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._http.loop).result(5)

    async def _send_newest(self, frame: dict[str, Any]) -> None:
        with self._lock:
            if not self._sockets:
                raise RuntimeError("no open Socket Mode connection")
            ws = self._sockets[-1]
        await ws.send_text(json.dumps(frame))

    async def _send_newest_text(self, text: str) -> None:
        with self._lock:
            if not self._sockets:
                raise RuntimeError("no open Socket Mode connection")
            ws = self._sockets[-1]
        await ws.send_text(text)

    async def _disconnect(self, reason: str) -> None:
        with self._lock:
            sockets = list(self._sockets)
        for ws in sockets:
            await ws.send_text(
                json.dumps({"type": "disconnect", "reason": reason, "debug_info": {"host": "f"}})
            )
            await ws.close()

    async def _socket(self, ws: WebSocket) -> None:
        ticket = ws.query_params.get("ticket", "")
        with self._lock:
            valid = ticket in self._tickets
            self._tickets.discard(ticket)  # single use, like Slack's
        if not valid:
            await ws.close(code=1008)
            return
        await ws.accept()
        with self._lock:
            self._sockets.append(ws)
        try:
            await ws.send_text(
                json.dumps(
                    {
                        "type": "hello",
                        "num_connections": len(self._sockets),
                        "debug_info": {"host": "fake", "approximate_connection_time": 18060},
                        "connection_info": {"app_id": APP_ID},
                    }
                )
            )
            while True:
                frame = json.loads(await ws.receive_text())
                if isinstance(frame, dict) and "envelope_id" in frame:
                    with self._lock:
                        self.acks.append(str(frame["envelope_id"]))
        except (WebSocketDisconnect, RuntimeError):
            pass
        finally:
            with self._lock:
                if ws in self._sockets:
                    self._sockets.remove(ws)

    # ---------------------------------------------------------------- Web API

    async def _api(self, request: Request) -> Response:
        method = request.path_params["method"]
        args: dict[str, Any] = dict(request.query_params)
        content_type = request.headers.get("content-type", "")
        if content_type.startswith("application/json"):
            if method in _WRITE_METHODS:  # Slack reads JSON bodies only on write methods
                body = json.loads(await request.body())
                args.update(body if isinstance(body, dict) else {})
        elif content_type.startswith("application/x-www-form-urlencoded"):
            args.update(urllib.parse.parse_qsl((await request.body()).decode()))
        auth = request.headers.get("authorization", "")
        token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None
        with self._lock:
            self.calls.append(Call(method, token, args))
            queued = self._failures.get(method)
            failure = queued.popleft() if queued else None
        if failure is not None and not failure.after_effect:
            return _failed(failure)
        refused = self._refuse_token(method, token)
        answer = refused or self._dispatch(method, args)
        if failure is not None:
            return _failed(failure)
        return JSONResponse(answer)

    def _refuse_token(self, method: str, token: str | None) -> dict[str, Any] | None:
        if token is None:
            return {"ok": False, "error": "not_authed"}
        wanted = APP_TOKEN if method == "apps.connections.open" else BOT_TOKEN
        if token == wanted:
            return None
        if token in (APP_TOKEN, BOT_TOKEN):
            return {"ok": False, "error": "not_allowed_token_type"}
        return {"ok": False, "error": "invalid_auth"}

    def _dispatch(self, method: str, args: dict[str, Any]) -> dict[str, Any]:
        handler = {
            "auth.test": self._auth_test,
            "users.info": self._users_info,
            "users.list": self._users_list,
            "users.lookupByEmail": self._users_lookup_by_email,
            "usergroups.list": self._usergroups_list,
            "chat.postMessage": self._post_message,
            "conversations.replies": self._replies,
            "reactions.add": self._reactions_add,
            "apps.connections.open": self._connections_open,
        }.get(method)
        if handler is None:
            return {"ok": False, "error": "unknown_method"}
        with self._lock:
            return handler(args)

    def _auth_test(self, args: dict[str, Any]) -> dict[str, Any]:
        return {
            "ok": True,
            "url": "https://fake.slack.com/",
            "team": "Fake",
            "user": "superagent",
            "team_id": TEAM_ID,
            "user_id": BOT_USER,
            "bot_id": BOT_ID,
            "is_enterprise_install": False,
        }

    def _users_info(self, args: dict[str, Any]) -> dict[str, Any]:
        user = self.users.get(str(args.get("user", "")))
        if user is None:
            return {"ok": False, "error": "user_not_found"}
        return {"ok": True, "user": user}

    def _users_list(self, args: dict[str, Any]) -> dict[str, Any]:
        members = sorted(self.users.values(), key=lambda user: str(user["id"]))
        limit = min(int(args.get("limit") or 1000), self.page_size_cap)
        cursor = str(args.get("cursor") or "")
        start = int(base64.b64decode(cursor).decode()) if cursor else 0
        more = start + limit < len(members)
        next_cursor = base64.b64encode(str(start + limit).encode()).decode() if more else ""
        return {
            "ok": True,
            "members": members[start : start + limit],
            "cache_ts": int(time.time()),
            "response_metadata": {"next_cursor": next_cursor},
        }

    def _users_lookup_by_email(self, args: dict[str, Any]) -> dict[str, Any]:
        email = str(args.get("email", "")).lower()
        for user in self.users.values():
            if str(user["profile"].get("email", "")).lower() == email and email:
                return {"ok": True, "user": user}
        return {"ok": False, "error": "users_not_found"}

    def _usergroups_list(self, args: dict[str, Any]) -> dict[str, Any]:
        with_users = _true(args.get("include_users"))
        groups = [
            {
                "id": g["id"],
                "team_id": TEAM_ID,
                "handle": g["handle"],
                "name": g["handle"],
                "user_count": len(g["users"]),
                **({"users": g["users"]} if with_users else {}),
            }
            for g in self.usergroups
        ]
        return {"ok": True, "usergroups": groups}

    def _channel(self, args: dict[str, Any]) -> Channel | dict[str, Any]:
        channel = self.channels.get(str(args.get("channel", "")))
        if channel is None:
            return {"ok": False, "error": "channel_not_found"}
        if not channel.bot_member:
            return {"ok": False, "error": "not_in_channel"}
        return channel

    def _post_message(self, args: dict[str, Any]) -> dict[str, Any]:
        channel = self._channel(args)
        if isinstance(channel, dict):
            return channel
        text = args.get("text")
        if not text:
            return {"ok": False, "error": "no_text"}
        metadata = args.get("metadata")
        if isinstance(metadata, str):
            metadata = json.loads(metadata)
        if metadata is not None and not (
            isinstance(metadata, dict)
            and isinstance(metadata.get("event_type"), str)
            and isinstance(metadata.get("event_payload"), dict)
        ):
            return {"ok": False, "error": "invalid_metadata_format"}
        message: dict[str, Any] = {
            "type": "message",
            "user": BOT_USER,
            "bot_id": BOT_ID,
            "app_id": APP_ID,
            "text": text,
            "ts": self._next_ts(),
        }
        if args.get("thread_ts"):
            message["thread_ts"] = str(args["thread_ts"])
        if metadata is not None:
            message["metadata"] = metadata
        channel.messages.append(message)
        shown = {k: v for k, v in message.items() if k != "metadata"}
        return {"ok": True, "channel": channel.id, "ts": message["ts"], "message": shown}

    def _replies(self, args: dict[str, Any]) -> dict[str, Any]:
        channel = self._channel(args)
        if isinstance(channel, dict):
            return channel
        ts = str(args.get("ts", ""))
        thread = [m for m in channel.messages if m["ts"] == ts or m.get("thread_ts") == ts]
        if not any(m["ts"] == ts for m in thread):
            return {"ok": False, "error": "thread_not_found"}
        thread.sort(key=lambda m: tuple(int(part) for part in m["ts"].split(".")))
        if not _true(args.get("include_all_metadata")):
            thread = [{k: v for k, v in m.items() if k != "metadata"} for m in thread]
        limit = min(int(args.get("limit") or 1000), self.page_size_cap)
        cursor = str(args.get("cursor") or "")
        start = int(base64.b64decode(cursor).decode()) if cursor else 0
        page = thread[start : start + limit]
        more = start + limit < len(thread)
        next_cursor = base64.b64encode(str(start + limit).encode()).decode() if more else ""
        return {
            "ok": True,
            "messages": page,
            "has_more": more,
            "response_metadata": {"next_cursor": next_cursor},
        }

    def _reactions_add(self, args: dict[str, Any]) -> dict[str, Any]:
        channel = self._channel(args)
        if isinstance(channel, dict):
            return channel
        ts, name = str(args.get("timestamp", "")), str(args.get("name", ""))
        message = next((m for m in channel.messages if m["ts"] == ts), None)
        if message is None:
            return {"ok": False, "error": "message_not_found"}
        reactions: list[dict[str, Any]] = message.setdefault("reactions", [])
        reaction = next((r for r in reactions if r["name"] == name), None)
        if reaction is not None and BOT_USER in reaction["users"]:
            return {"ok": False, "error": "already_reacted"}
        if reaction is None:
            reactions.append({"name": name, "users": [BOT_USER], "count": 1})
        else:
            reaction["users"].append(BOT_USER)
            reaction["count"] += 1
        return {"ok": True}

    def _connections_open(self, args: dict[str, Any]) -> dict[str, Any]:
        ticket = str(uuid.uuid4())
        self._tickets.add(ticket)
        self.connections_opened += 1
        return {"ok": True, "url": f"ws://{self.host}:{self._http.port}/link/?ticket={ticket}"}

    def _next_ts(self) -> str:
        return f"{int(time.time())}.{next(self._ts):06d}"


def _channel_type(channel: str) -> str:
    return {"D": "im", "G": "group"}.get(channel[:1], "channel")


def _true(value: Any) -> bool:
    return value is True or str(value).lower() in ("true", "1")


def _failed(failure: Failure) -> Response:
    if failure.status == 429:
        return JSONResponse(
            {"ok": False, "error": "ratelimited"},
            status_code=429,
            headers={"Retry-After": str(failure.retry_after or 30)},
        )
    if failure.status >= 500:
        return PlainTextResponse("upstream connect error", status_code=failure.status)
    return JSONResponse({"ok": False, "error": failure.error or "fatal_error", **failure.extra})
