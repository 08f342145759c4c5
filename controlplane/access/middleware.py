"""Access: every HTTP and websocket request needs the admin token or a session, one middleware.

The token (the admin token, or a named API token: :mod:`.api_tokens`) comes as
``Authorization: Bearer …`` (the CLI, scripts, Prometheus) or as a session made from the
admin token (a browser's cookie, :mod:`.sessions`); who the caller is, once
verified, is :mod:`.authentication`'s word. Nothing
is trusted for looking local: not the ``Host`` header (anyone can send ``Host:
127.0.0.1``), not the peer address (a local reverse proxy makes every peer 127.0.0.1, and
on a shared machine every user is a loopback peer).

The rule is default-deny: a route is public only when it is in :data:`PUBLIC_PATHS` or
under :data:`PUBLIC_PREFIXES`, each with its reason, so a new route is protected without
anyone remembering to protect it. Tokens are never read from a URL query: no surface here
needs one there (websockets carry the cookie or a header), and URLs end up in logs,
browser history and Referer headers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable

from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket

from controlplane.access import api_tokens, authentication, browsers, sessions, throttle
from controlplane.errors import SuperagentError, TransientError, Unauthorized
from controlplane.services import is_transient
from controlplane.web import headers
from controlplane.web.state import AppState

CLOSE_UNAUTHORIZED = 1008  # a websocket refused for its credentials or its origin
SESSION_RECHECK_SECONDS = 15.0  # how soon an open websocket notices its session ended

# Public, each for a reason: probes must answer without credentials; webhooks prove
# themselves with their channel's signature; the sign-in endpoints and the sign-in page's
# static files are how a browser gets a session; "/" only redirects to the console.
PUBLIC_PATHS = frozenset({"/", "/healthz", "/readyz", "/console/login", "/chat/session"})
PUBLIC_PREFIXES = ("/webhooks/", "/console/static/")
# A browser asking for one of these pages without a session gets the sign-in form (401).
_PAGES = ("/console", "/chat", "/docs", "/redoc")
_NOT_PAGES = ("/console/api/", "/chat/api/")


def is_public(path: str) -> bool:
    return path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)


class RequireAccess:
    """ASGI middleware: a non-public request goes on only with a verified principal.

    ``login_page(target)`` renders the sign-in form that leads back to ``target``: the
    console's page, handed in by the application so that this package stays below the
    console.
    """

    def __init__(self, app: ASGIApp, state: AppState, login_page: Callable[[str], str]) -> None:
        self.app = app
        self.state = state
        self.login_page = login_page

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or is_public(scope["path"]):
            await self.app(scope, receive, send)
            return
        try:
            who = await self._verify(HTTPConnection(scope))
        except SuperagentError as exc:
            await _refuse(scope, receive, send, exc, self.login_page)
            return
        scope[authentication.PRINCIPAL] = who
        if scope["type"] == "websocket" and who.via == "session":
            await self._while_signed_in(scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def _while_signed_in(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A websocket lives no longer than the session that opened it: signed out or
        expired, the socket is closed (1008) within ``SESSION_RECHECK_SECONDS``."""
        secret = HTTPConnection(scope).cookies.get(sessions.COOKIE, "")
        ended = asyncio.Event()

        async def watch() -> None:
            while True:
                await asyncio.sleep(SESSION_RECHECK_SECONDS)
                token = self.state.settings.admin_token
                try:
                    ok = token is not None and await sessions.valid(
                        self.state.pool, secret, token.get_secret_value()
                    )
                except Exception as exc:
                    if not is_transient(exc):
                        raise
                    continue  # a database away for a moment ends nobody's session
                if not ok:
                    ended.set()
                    with contextlib.suppress(Exception):
                        await send({"type": "websocket.close", "code": CLOSE_UNAUTHORIZED})
                    return

        async def receive_until_ended() -> Message:
            if ended.is_set():
                return {"type": "websocket.disconnect", "code": CLOSE_UNAUTHORIZED}
            message = await receive()
            return message

        watcher = asyncio.create_task(watch())
        try:
            await self.app(scope, receive_until_ended, send)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    async def _verify(self, conn: HTTPConnection) -> authentication.Principal:
        settings = self.state.settings
        browsers.check_origin(conn)
        scheme, _, presented = conn.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            # A browser's credential is its cookie, which a DNS-rebinding page cannot
            # have either; refusing the foreign name is the second lock. A bearer token
            # is not ambient: a page can only send it if it already knows it.
            browsers.check_host(conn, settings)
        if settings.admin_token is None:
            raise Unauthorized(
                "this server has no admin token; set SUPERAGENT_ADMIN_TOKEN "
                "(`superagent up` generates one)"
            )
        if scheme.lower() == "bearer":
            return await self._bearer(conn, presented.strip())
        secret = conn.cookies.get(sessions.COOKIE)
        if not secret:
            raise Unauthorized(authentication.NEEDS_TOKEN)
        token = settings.admin_token.get_secret_value()
        try:
            ok = await sessions.valid(self.state.pool, secret, token)
        except Exception as exc:
            if is_transient(exc):
                raise TransientError("the database is not answering; see /readyz") from exc
            raise
        if not ok:
            raise Unauthorized("this sign-in has expired or ended; sign in again")
        return authentication.Principal(authentication.ADMIN, "session")

    async def _bearer(self, conn: HTTPConnection, presented: str) -> authentication.Principal:
        """A bearer token is counted as an attempt *before* it is compared (TooManyAttempts
        past the limit, without comparing): a burst cannot outrun the count, and a locked
        peer's guesses are neither compared nor timed. A right token takes its count back.

        With the database away the count is this replica's own, in memory: the admin's
        monitoring (``/metrics``, ``/readyz``) must still answer in an outage, and guesses
        are still counted first."""
        settings = self.state.settings
        where = authentication.peer(conn)
        limit, window = settings.http.signin_attempts, settings.http.signin_window_seconds
        try:
            await throttle.count(self.state.pool, where, limit=limit, window=window)
            counted = throttle.uncount
        except Exception as exc:
            if not is_transient(exc):
                raise
            throttle.HERE.count(where, limit=limit, window=window)
            counted = throttle.HERE.uncount
        name = authentication.ADMIN if authentication.token_matches(settings, presented) else None
        if name is None:
            try:
                name = await api_tokens.holder(self.state.pool, presented)
            except Exception as exc:
                if is_transient(exc):
                    raise TransientError("the database is not answering; see /readyz") from exc
                raise
        if name is None:
            raise Unauthorized(
                "that is neither the admin token nor a live API token: send "
                "'Authorization: Bearer <token>' (superagent tokens create NAME makes one)"
            )
        with contextlib.suppress(Exception):  # a count left standing only ever locks sooner
            await counted(self.state.pool, where)
        return authentication.Principal(name, "bearer")


async def _refuse(
    scope: Scope,
    receive: Receive,
    send: Send,
    exc: SuperagentError,
    login_page: Callable[[str], str],
) -> None:
    if scope["type"] == "websocket":
        # Accepted first, so that the refusal can say why: a refused handshake is a bare
        # 403 that a page's script cannot read.
        websocket = WebSocket(scope, receive, send)
        await websocket.accept()
        await websocket.send_json({"type": "error", "message": exc.message})
        await websocket.close(
            CLOSE_UNAUTHORIZED, exc.message.encode()[:120].decode(errors="ignore")
        )
        return
    reply: list[tuple[bytes, bytes]] = [(b"cache-control", b"no-store")]
    retry_after = getattr(exc, "retry_after", None)
    if retry_after is not None:
        reply.append((b"retry-after", str(retry_after).encode()))
    if exc.http_status == 401:
        reply.append((b"www-authenticate", b'Bearer realm="superagent"'))
    if _wants_page(scope) and exc.http_status == 401:
        query = scope.get("query_string", b"").decode("latin-1")
        target = scope["path"] + (f"?{query}" if query else "")
        body = login_page(target).encode()  # the sign-in form, rendered in place
        reply.append((b"content-type", b"text/html; charset=utf-8"))
        reply += [
            (name.lower().encode(), value.encode())
            for name, value in headers.PAGE_HEADERS.items()
            if name != "Cache-Control"
        ]
    else:
        body = json.dumps({"error": {"code": exc.code, "message": exc.message}}).encode()
        reply += [(b"content-type", b"application/json"), (b"x-content-type-options", b"nosniff")]
    reply.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": exc.http_status, "headers": reply})
    await send({"type": "http.response.body", "body": body})


def _wants_page(scope: Scope) -> bool:
    path: str = scope["path"]
    accept = HTTPConnection(scope).headers.get("accept", "")
    return (
        scope.get("method") == "GET"
        and "text/html" in accept
        and path.startswith(_PAGES)
        and not path.startswith(_NOT_PAGES)
    )
