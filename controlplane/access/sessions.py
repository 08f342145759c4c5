"""Console and chat sign-ins as rows in Postgres, and the one-time sign-in link.

A browser signs in once with the admin token (or a one-time link printed by ``superagent
up``) and gets a random session secret in an HttpOnly cookie. The table keeps only its
SHA-256, an expiry the server enforces, and ``revoked_at``, set on sign-out: a cookie is
worth nothing once it is signed out, expired, or the token it was made from is rotated
(``token_tag``). Any replica can check any session, because the rows are shared.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import timedelta

from starlette.requests import HTTPConnection
from starlette.responses import Response

from controlplane.db.pool import Db, transaction

COOKIE = "superagent_session"
LINK_TTL = timedelta(hours=1)
_SECRET_BYTES = 32


def _hash(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def token_tag(token: str) -> bytes:
    """A keyed digest naming the admin token a session was made from (not the token)."""
    return hmac.new(token.encode(), b"superagent console session v2", hashlib.sha256).digest()[:16]


async def _insert(db: Db, kind: str, token: str, peer: str | None, ttl: timedelta) -> str:
    secret = secrets.token_urlsafe(_SECRET_BYTES)
    async with transaction(db) as conn:
        # Expired rows go as new ones come: the table stays as small as its live sessions.
        await conn.execute(
            "DELETE FROM console_sessions WHERE expires_at < now() - interval '1 day'"
        )
        await conn.execute(
            "INSERT INTO console_sessions (secret_hash, kind, token_tag, peer, expires_at) "
            "VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5))",
            _hash(secret),
            kind,
            token_tag(token),
            peer[:100] if peer else None,
            ttl.total_seconds(),
        )
    return secret


async def start(db: Db, token: str, peer: str | None, ttl: timedelta) -> str:
    """A new session's secret (for the cookie)."""
    return await _insert(db, "session", token, peer, ttl)


async def valid(db: Db, secret: str, token: str) -> bool:
    if not secret or len(secret) > 200:
        return False
    found = await db.fetchval(
        "SELECT 1 FROM console_sessions WHERE secret_hash = $1 AND kind = 'session' "
        "AND token_tag = $2 AND revoked_at IS NULL AND expires_at > now()",
        _hash(secret),
        token_tag(token),
    )
    return found is not None


async def end(db: Db, secret: str) -> None:
    """Sign out: the session's cookie opens nothing from now on, on every replica."""
    await db.execute(
        "UPDATE console_sessions SET revoked_at = now() "
        "WHERE secret_hash = $1 AND revoked_at IS NULL",
        _hash(secret),
    )


async def create_link(db: Db, token: str, ttl: timedelta = LINK_TTL) -> str:
    """A one-time sign-in link's secret: the link, unlike the token, is spent by its use."""
    return await _insert(db, "link", token, None, ttl)


async def redeem_link(
    db: Db, secret: str, token: str, peer: str | None, ttl: timedelta
) -> str | None:
    """A new session for a link used for the first time, before it expires; else None."""
    if not secret or len(secret) > 200:
        return None
    spent = await db.fetchval(
        "UPDATE console_sessions SET revoked_at = now() WHERE secret_hash = $1 "
        "AND kind = 'link' AND token_tag = $2 AND revoked_at IS NULL "
        "AND expires_at > now() RETURNING 1",
        _hash(secret),
        token_tag(token),
    )
    if spent is None:
        return None
    return await start(db, token, peer, ttl)


def set_cookie(response: Response, conn: HTTPConnection, secret: str, ttl: timedelta) -> None:
    """Give the browser the session cookie (only once the token or a link matched)."""
    response.set_cookie(
        COOKIE,
        secret,
        max_age=int(ttl.total_seconds()),
        path="/",  # the console and the chat it embeds
        httponly=True,  # out of reach of scripts
        samesite="strict",  # never sent by other sites' pages, websockets included
        secure=conn.url.scheme == "https",
    )


def clear_cookie(response: Response) -> None:
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
