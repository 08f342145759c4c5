"""The bot's account on its homeserver: logging in, and calling the API through matrix-nio.

Every call goes through :meth:`MatrixAccount.call`, the one place where nio's results become
this project's errors:

* a network failure, a timeout or a 5xx is a :class:`TransientError` (retried by the caller);
* ``M_LIMIT_EXCEEDED`` is :class:`RateLimited` with the homeserver's ``retry_after_ms``;
* any other refusal (``M_FORBIDDEN``, an unknown room, a bad token) is a
  :class:`ChannelError` naming what to fix.

nio's own retry loops are switched off (they would sleep through rate limits and retry
timeouts forever, hiding both from the outbox), and so is end-to-end encryption: the bot
reads and writes unencrypted rooms only.

With a password the bot logs in once per process, always with the configured device id, so
that transaction ids (and thus retried sends) are deduplicated by the homeserver across
restarts; a token the homeserver has since revoked is replaced by logging in again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from nio import AsyncClient, AsyncClientConfig, ErrorResponse

from controlplane.channels.base import ChannelError, RateLimited
from controlplane.errors import TransientError
from controlplane.settings import MatrixSettings

log = logging.getLogger(__name__)

DEVICE_NAME = "Super-agent"
_DEFAULT_RETRY_SECONDS = 5.0
_BAD_TOKEN = ("M_UNKNOWN_TOKEN", "M_MISSING_TOKEN")


ROOM_HINT = "is the bot a member of the room, and allowed to post there?"
LOGIN_HINT = (
    "check SUPERAGENT_MATRIX__PASSWORD, and that the homeserver allows password login "
    "(otherwise set SUPERAGENT_MATRIX__ACCESS_TOKEN)"
)


def error_for(response: ErrorResponse, what: str, *, hint: str = ROOM_HINT) -> Exception:
    """The project's error for a homeserver's refusal of ``what``; ``hint`` says what to
    check when it is forbidden."""
    code = response.status_code or ""
    message = response.message or "no message"
    transport = getattr(response, "transport_response", None)
    status = getattr(transport, "status", None)
    if code == "M_LIMIT_EXCEEDED" or status == 429:
        seconds = (response.retry_after_ms or 0) / 1000 or _DEFAULT_RETRY_SECONDS
        return RateLimited(seconds, f"matrix: {what}: rate limited for {seconds:.1f}s")
    if code in _BAD_TOKEN:
        return ChannelError(
            f"{what}: the homeserver rejected the bot's credentials ({code}); set a valid "
            "SUPERAGENT_MATRIX__ACCESS_TOKEN, or SUPERAGENT_MATRIX__PASSWORD"
        )
    if code == "M_FORBIDDEN":
        return ChannelError(f"{what}: forbidden ({message}); {hint}")
    if isinstance(status, int) and 400 <= status < 500:
        return ChannelError(f"{what}: {code or status} {message}")
    # 5xx, a proxy's HTML page, a response nio could not parse: worth another try.
    return TransientError(f"matrix: {what}: {code or status or 'error'} {message}")


class MatrixAccount:
    """Credentials and login for the bot; clients made here share its access token."""

    def __init__(self, settings: MatrixSettings) -> None:
        if settings.homeserver is None or settings.user_id is None:
            raise ValueError("matrix: the adapter needs homeserver and user_id")
        self.settings = settings
        self.homeserver = settings.homeserver.rstrip("/")
        self.user_id = settings.user_id
        self._token = settings.access_token.get_secret_value() if settings.access_token else None
        self._password = settings.password.get_secret_value() if settings.password else None
        self._login_lock = asyncio.Lock()

    def client(self) -> AsyncClient:
        """A new nio client (its own HTTP session: close it) with retries switched off."""
        config = AsyncClientConfig(
            max_limit_exceeded=0,
            max_timeouts=0,
            request_timeout=self.settings.timeout_seconds,
            encryption_enabled=False,
            store_sync_tokens=False,
        )
        client = AsyncClient(
            self.homeserver, self.user_id, device_id=self.settings.device_id, config=config
        )
        client.user_id = self.user_id
        return client

    async def call(
        self,
        client: AsyncClient,
        request: Callable[[AsyncClient], Awaitable[Any]],
        what: str,
        *,
        accept: frozenset[str] = frozenset(),
    ) -> Any:
        """``request(client)`` with the current token; its successful nio response (or an
        error response whose code is in ``accept``), or the project's error (see the module's
        docstring)."""
        for attempt in (1, 2):
            token = await self._access_token(client)
            client.access_token = token
            response = await _transport(request(client), what)
            if not isinstance(response, ErrorResponse) or response.status_code in accept:
                return response
            if response.status_code in _BAD_TOKEN and self._password and attempt == 1:
                log.warning("matrix: the bot's access token was rejected; logging in again")
                self._forget(token)
                continue
            raise error_for(response, what)
        raise AssertionError("unreachable")

    async def _access_token(self, client: AsyncClient) -> str:
        if self._token is not None:
            return self._token
        async with self._login_lock:
            if self._token is None:
                self._token = await self._login(client)
            return self._token

    def _forget(self, token: str) -> None:
        if self._token == token:  # not already replaced by a concurrent caller
            self._token = None

    async def _login(self, client: AsyncClient) -> str:
        if self._password is None:
            raise ChannelError(
                "the homeserver rejected SUPERAGENT_MATRIX__ACCESS_TOKEN; set a valid one, "
                "or SUPERAGENT_MATRIX__PASSWORD to log in on start"
            )
        what = f"password login as {self.user_id}"
        client.device_id = self.settings.device_id
        response = await _transport(client.login(self._password, device_name=DEVICE_NAME), what)
        if isinstance(response, ErrorResponse):
            raise error_for(response, what, hint=LOGIN_HINT)
        log.info("matrix: logged in as %s (device %s)", self.user_id, response.device_id)
        return str(response.access_token)


async def _transport(request: Awaitable[Any], what: str) -> Any:
    try:
        return await request
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise TransientError(f"matrix: {what}: {type(exc).__name__}: {exc}") from None
