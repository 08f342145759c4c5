"""Authentication: who the caller of an HTTP request is.

Every holder of the admin token is one principal, the admin; a caller proves it with the
token itself (``Authorization: Bearer …``) or with a sign-in session made from it
(:mod:`.sessions`). A named API token (:mod:`.api_tokens`) is the principal it is named
for: its name is who acted, in the records of what it did.
:class:`.middleware.RequireAccess` verifies every non-public request and puts the caller
in the ASGI scope; routes read it with :func:`principal`, so no route can be reached by a
path that skipped the verification.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from starlette.requests import HTTPConnection

from controlplane.errors import Unauthorized
from controlplane.peers import peer_group
from controlplane.settings import Settings

PRINCIPAL = "superagent.principal"
ADMIN = "admin"  # every holder of the admin token is this one principal
NEEDS_TOKEN = (
    "this needs the admin token (SUPERAGENT_ADMIN_TOKEN): sign in on /console/login, or "  # noqa: S105 - a message
    "send it as 'Authorization: Bearer …'"
)


@dataclass(frozen=True)
class Principal:
    name: str
    via: Literal["bearer", "session"]


def principal(conn: HTTPConnection) -> Principal:
    """The caller the middleware verified; Unauthorized if there is none."""
    found = conn.scope.get(PRINCIPAL)
    if not isinstance(found, Principal):
        raise Unauthorized(NEEDS_TOKEN)
    return found


def token_matches(settings: Settings, presented: str) -> bool:
    """Constant-time comparison with the admin token; False when there is none."""
    if settings.admin_token is None:
        return False
    # Bytes: compare_digest refuses str with non-ASCII characters.
    expected = settings.admin_token.get_secret_value().encode()
    return hmac.compare_digest(presented.encode(), expected)


def session_ttl(settings: Settings) -> timedelta:
    return timedelta(seconds=settings.http.session_seconds)


def peer(conn: HTTPConnection) -> str:
    return peer_group(conn.client.host if conn.client else None)
