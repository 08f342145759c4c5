"""Slack's Web API as the adapter calls it: one method call, Slack's failures made ours.

* HTTP 429 (and ``ok: false`` with ``ratelimited``) → :class:`RateLimited` with Slack's
  ``Retry-After``.
* Network errors, timeouts, 5xx, a body that is not JSON, and Slack's own transient codes
  (``internal_error``, ``fatal_error``, ``service_unavailable``, ``request_timeout``) →
  :class:`TransientError`: retried by whoever called (the outbox, the socket loop, Slack's
  own redelivery of an event we answered 503).
* Any other ``ok: false`` → :class:`SlackError` (a :class:`ChannelError`) whose message
  says what to fix: the setting, the scope, the channel invitation.

One :class:`WebApi` per token (the bot token for everything, the app-level token only for
``apps.connections.open``), so an error can name the setting the token came from. Tokens
go in the ``Authorization`` header only: never in a URL, a log line or an error message.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
from pydantic import SecretStr

from controlplane.channels.base import ChannelError, RateLimited
from controlplane.errors import TransientError

log = logging.getLogger(__name__)

_TRANSIENT_CODES = frozenset(
    {"internal_error", "fatal_error", "service_unavailable", "request_timeout"}
)
_AUTH_CODES = frozenset(
    {"invalid_auth", "not_authed", "account_inactive", "token_revoked", "token_expired"}
)
_DEFAULT_RETRY_AFTER = 30.0
_MAX_PAGES = 50  # a bound on any cursor walk: 50 pages of up to 200 items


class SlackError(ChannelError):
    """Slack answered ``ok: false`` with ``code``; retrying the same call will not help."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class WebApi:
    """Calls Slack Web API methods with one token (see the module docstring)."""

    def __init__(
        self, base_url: str, token: SecretStr, setting: str, client: httpx.AsyncClient
    ) -> None:
        self._base = base_url.rstrip("/")
        self._token = token
        self._setting = setting  # the environment variable the token comes from
        self._client = client

    async def call(
        self,
        method: str,
        *,
        json: dict[str, Any] | None = None,
        form: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Slack's answer to ``method``; ``json`` for write methods, ``form`` for reads
        (Slack accepts JSON bodies only on write methods)."""
        headers = {"Authorization": f"Bearer {self._token.get_secret_value()}"}
        try:
            if json is not None:
                response = await self._client.post(
                    f"{self._base}/{method}", json=json, headers=headers
                )
            else:
                response = await self._client.post(
                    f"{self._base}/{method}", data=form or {}, headers=headers
                )
        except httpx.TransportError as exc:
            raise TransientError(f"Slack {method}: {type(exc).__name__} ({exc})") from None
        if response.status_code == 429:
            raise _rate_limited(method, response)
        if response.status_code >= 500:
            raise TransientError(f"Slack {method} answered HTTP {response.status_code}")
        if response.status_code != 200:
            raise SlackError(
                f"http_{response.status_code}",
                f"Slack {method} answered HTTP {response.status_code}; check "
                "SUPERAGENT_SLACK__API_URL (it should end in /api)",
            )
        try:
            body = response.json()
        except ValueError:
            raise TransientError(f"Slack {method} answered something that is not JSON") from None
        if not isinstance(body, dict):
            raise TransientError(f"Slack {method} answered JSON that is not an object")
        if body.get("ok") is True:
            return body
        code = str(body.get("error") or "unknown_error")
        if code == "ratelimited":
            raise _rate_limited(method, response)
        if code in _TRANSIENT_CODES:
            raise TransientError(f"Slack {method} failed: {code}")
        raise SlackError(code, self._explain(method, code, body, json or form or {}))

    async def pages(
        self, method: str, form: dict[str, str], key: str
    ) -> AsyncIterator[dict[str, Any]]:
        """The items under ``key`` across every page of a cursor-paginated read method."""
        cursor = ""
        for _page in range(_MAX_PAGES):
            body = await self.call(method, form={**form, **({"cursor": cursor} if cursor else {})})
            for item in body.get(key) or []:
                if isinstance(item, dict):
                    yield item
            cursor = str((body.get("response_metadata") or {}).get("next_cursor") or "")
            if not cursor:
                return
        log.warning("slack %s: stopped after %d pages", method, _MAX_PAGES)

    def _explain(self, method: str, code: str, body: dict[str, Any], args: Any) -> str:
        channel = str(args.get("channel", "")) if isinstance(args, dict) else ""
        where = f"channel {channel}" if channel else "the channel"
        if code in _AUTH_CODES:
            return (
                f"Slack refused the token in {self._setting} ({code}): set it to the app's "
                "current token and restart"
            )
        if code == "not_allowed_token_type":
            return f"{self._setting} is the wrong kind of token for {method}"
        if code == "missing_scope":
            needed = body.get("needed") or "a scope"
            return (
                f"the Slack app lacks the {needed} scope for {method}: add it under OAuth & "
                f"Permissions, reinstall the app, and update {self._setting} if Slack issued "
                "a new token"
            )
        if code == "not_in_channel":
            return f"the bot is not a member of {where}: invite it (/invite @the-app)"
        if code == "channel_not_found":
            return f"{where} does not exist or the bot cannot see it: invite the bot there"
        if code == "is_archived":
            return f"{where} is archived: unarchive it to reply there"
        if code in ("thread_not_found", "message_not_found", "no_item_specified"):
            return f"the message in {where} no longer exists (deleted?)"
        if code.startswith("restricted_action"):
            return f"the workspace does not let the bot post in {where} ({code})"
        if code == "link_disabled":
            return "Socket Mode is off for this app: turn it on under Socket Mode in the app"
        return f"Slack {method} failed: {code}"


def _rate_limited(method: str, response: httpx.Response) -> RateLimited:
    raw = response.headers.get("retry-after", "")
    try:
        seconds = max(float(raw), 1.0)
    except ValueError:
        seconds = _DEFAULT_RETRY_AFTER
    return RateLimited(seconds, f"Slack {method} is rate limited; retry after {seconds:.0f}s")
