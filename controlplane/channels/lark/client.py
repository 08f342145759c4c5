"""Lark's Open API, the few calls the channel makes: replies, reactions, who the bot is,
display names, and an email's open_id (to resolve ``lark:EMAIL`` in a policy or a link).

Every call carries a ``tenant_access_token``, fetched from the app's credentials and cached
until five minutes before it expires; one Lark says is invalid (revoked, rotated secret) is
dropped and fetched again, once per call.

Lark answers ``{"code": 0, ...}`` on success and a non-zero ``code`` with a ``msg`` otherwise.
Failures are sorted for the outbox: a rate limit is :class:`RateLimited` (wait, then retry),
a problem only a person can fix (a missing permission, the bot not in the chat, a deleted
message) is :class:`ChannelError`, and 5xx or network trouble is a plain exception
(:class:`TransientError`, ``httpx.HTTPError``) that is retried with backoff.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx

from controlplane.channels.base import ChannelError, RateLimited
from controlplane.errors import TransientError

log = logging.getLogger(__name__)

TOKEN_PATH = "/open-apis/auth/v3/tenant_access_token/internal"  # noqa: S105 - a path
BOT_INFO_PATH = "/open-apis/bot/v3/info"
TOKEN_MARGIN_SECONDS = 300.0  # a token is replaced this long before Lark expires it
INVALID_TOKEN_CODES = frozenset({99991661, 99991663})  # missing / invalid access token
# 99991400: the app's request rate; 230020: the per-chat message rate (5 per second).
RATE_LIMIT_CODES = frozenset({99991400, 230020})
DEFAULT_RETRY_SECONDS = 1.0

# What a person has to do about the commonest permanent failures.
_HINTS = {
    10003: "the app id is wrong (SUPERAGENT_LARK__APP_ID)",
    10014: "the app secret is wrong (SUPERAGENT_LARK__APP_SECRET)",
    99991672: "the app lacks a permission (scope) this call needs; add it and publish a version",
    230002: "the bot is not in this chat; add it to the group",
    230006: "the app's bot ability is not enabled; enable it and publish a version",
    230011: "the message was recalled",
    230027: "the app lacks a permission this call needs; add it and publish a version",
    231003: "the message does not exist (deleted, or from another app)",
}


class LarkError(ChannelError):
    """Lark refused a call for a reason retrying will not change."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class BotInfo:
    open_id: str
    name: str


class LarkApi:
    """One app's calls to Lark's Open API (``domain`` is the base URL)."""

    def __init__(
        self,
        domain: str,
        app_id: str,
        app_secret: str,
        *,
        timeout: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._app_id = app_id
        self._app_secret = app_secret
        self._http = httpx.AsyncClient(
            base_url=domain.rstrip("/"), timeout=timeout, transport=transport
        )
        self._token: str | None = None
        self._token_expires = 0.0  # time.monotonic() after which the token is not used
        self._token_lock = asyncio.Lock()

    async def close(self) -> None:
        await self._http.aclose()

    # ------------------------------------------------------------------ calls

    async def reply(self, message_id: str, text: str, *, uuid: str) -> str:
        """Reply to ``message_id`` in its thread; return the new message's id.

        ``uuid`` makes a retry idempotent on Lark's side (for an hour): the same uuid posts
        the message once.
        """
        body = {
            "msg_type": "text",
            "content": json.dumps({"text": text}, ensure_ascii=False),
            "reply_in_thread": True,
            "uuid": uuid,
        }
        data = await self._call(
            "POST",
            f"/open-apis/im/v1/messages/{message_id}/reply",
            body=json.dumps(body, ensure_ascii=False),
        )
        return str((data.get("data") or {}).get("message_id") or "")

    async def react(self, message_id: str, emoji_type: str) -> None:
        body = {"reaction_type": {"emoji_type": emoji_type}}
        await self._call(
            "POST",
            f"/open-apis/im/v1/messages/{message_id}/reactions",
            body=json.dumps(body, ensure_ascii=False),
        )

    async def bot_info(self) -> BotInfo:
        data = await self._call("GET", BOT_INFO_PATH)
        bot = data.get("bot") or {}
        if not bot.get("open_id"):
            raise ChannelError("Lark's bot info names no open_id: is the app's bot ability on?")
        return BotInfo(open_id=str(bot["open_id"]), name=str(bot.get("app_name") or ""))

    async def user_name(self, open_id: str) -> str | None:
        """The display name of a user (needs the contact:user.base:readonly permission)."""
        data = await self._call(
            "GET", f"/open-apis/contact/v3/users/{open_id}", params={"user_id_type": "open_id"}
        )
        user = (data.get("data") or {}).get("user") or {}
        name = user.get("name")
        return str(name) if name else None

    async def open_id_by_email(self, email: str) -> str | None:
        """The open_id of the member with this email, or None when Lark knows none
        (``batch_get_id``; needs the contact:user.id:readonly permission)."""
        data = await self._call(
            "POST",
            "/open-apis/contact/v3/users/batch_get_id",
            body=json.dumps({"emails": [email], "include_resigned": False}),
            params={"user_id_type": "open_id"},
        )
        for user in (data.get("data") or {}).get("user_list") or []:
            if isinstance(user, dict) and str(user.get("email", "")).lower() == email.lower():
                found = user.get("user_id")
                return str(found) if found else None
        return None

    # ------------------------------------------------------------------ plumbing

    async def _call(
        self,
        method: str,
        path: str,
        *,
        body: str | None = None,
        params: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        for attempt in (1, 2):
            token = await self._tenant_token()
            response = await self._http.request(
                method,
                path,
                content=body.encode() if body is not None else None,
                params=params,
                headers={
                    "Authorization": f"Bearer {token}",
                    "Content-Type": "application/json; charset=utf-8",
                },
            )
            data = _json(response)
            code = _code(data)
            if code in INVALID_TOKEN_CODES and attempt == 1:
                log.info("lark: the tenant access token was refused (%s); fetching a new one", code)
                self._forget_token(token)
                continue
            _raise_for(response, data, f"{method} {path}")
            return data
        raise ChannelError(f"{method} {path}: Lark refused a freshly issued access token")

    async def _tenant_token(self) -> str:
        async with self._token_lock:
            if self._token is not None and time.monotonic() < self._token_expires:
                return self._token
            response = await self._http.post(
                TOKEN_PATH, json={"app_id": self._app_id, "app_secret": self._app_secret}
            )
            data = _json(response)
            _raise_for(response, data, "fetching the tenant access token")
            token = data.get("tenant_access_token")
            if not isinstance(token, str) or not token:
                raise TransientError("Lark answered no tenant_access_token")
            expire = float(data.get("expire") or 0)
            self._token = token
            self._token_expires = time.monotonic() + max(expire - TOKEN_MARGIN_SECONDS, 0.0)
            return token

    def _forget_token(self, token: str) -> None:
        if self._token == token:
            self._token = None


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        data = response.json()
    except ValueError:
        data = None
    return data if isinstance(data, dict) else {}


def _code(data: dict[str, Any]) -> int | None:
    code = data.get("code")
    return code if isinstance(code, int) else None


def _retry_after(response: httpx.Response) -> float:
    # Lark's gateway says when the window resets; Retry-After is the HTTP standard.
    for header in ("x-ogw-ratelimit-reset", "retry-after"):
        value = response.headers.get(header)
        if value:
            try:
                return max(float(value), 0.0) or DEFAULT_RETRY_SECONDS
            except ValueError:
                continue
    return DEFAULT_RETRY_SECONDS


def _raise_for(response: httpx.Response, data: dict[str, Any], what: str) -> None:
    code = _code(data)
    if response.status_code == 429 or code in RATE_LIMIT_CODES:
        raise RateLimited(_retry_after(response), f"Lark rate-limited {what}")
    if response.status_code >= 500:
        raise TransientError(f"Lark answered {response.status_code} to {what}")
    if code == 0:
        return
    message = str(data.get("msg") or f"HTTP {response.status_code}")
    if code is None:
        raise LarkError(f"{what}: Lark answered HTTP {response.status_code} without a code")
    hint = _HINTS.get(code)
    raise LarkError(f"{what}: Lark error {code} ({message})" + (f": {hint}" if hint else ""), code)
