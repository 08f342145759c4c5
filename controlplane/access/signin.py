"""Signing a browser in with the admin token: counted per peer, then a session."""

from __future__ import annotations

from starlette.requests import HTTPConnection

from controlplane.access import authentication, sessions, throttle
from controlplane.db.pool import Db
from controlplane.settings import Settings


async def with_token(settings: Settings, db: Db, conn: HTTPConnection, token: str) -> str | None:
    """A new session's secret if ``token`` is the admin token, else None.

    The attempt is counted before the token is compared (TooManyAttempts past the limit),
    so concurrent guesses from one peer cannot outrun the count; the right token clears it.
    """
    where = authentication.peer(conn)
    await throttle.count(
        db,
        where,
        limit=settings.http.signin_attempts,
        window=settings.http.signin_window_seconds,
    )
    if settings.admin_token is None or not authentication.token_matches(settings, token):
        return None
    await throttle.clear(db, where)
    return await sessions.start(
        db, settings.admin_token.get_secret_value(), where, authentication.session_ttl(settings)
    )
