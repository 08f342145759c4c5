"""Who may use the console: exactly who may use the web chat.

The rule lives in :mod:`controlplane.channels.webchat.auth` (the admin token as a bearer
header, a query parameter or a session cookie; without a token, IP-address and localhost
hosts only; a browser's Origin must be this host). The console signs a browser in with the
same cookie, scoped to the whole site, so one sign-in opens both the console and the chat it
embeds. This module only words the refusals for the console and handles the sign-in form.
"""

from __future__ import annotations

from starlette.requests import HTTPConnection
from starlette.responses import Response

from controlplane.channels.webchat import auth
from controlplane.errors import Unauthorized
from controlplane.settings import Settings

COOKIE_MAX_AGE = 30 * 24 * 3600
HOME = "/console"
LOGIN = "/console/login"


def check_origin(conn: HTTPConnection) -> None:
    """Refuse what a browser sends on behalf of another site's page."""
    try:
        auth.check_origin(conn)
    except Unauthorized:
        raise Unauthorized("cross-origin console requests are refused") from None


def check(conn: HTTPConnection, settings: Settings) -> None:
    """Raise Unauthorized, saying what to do, unless ``conn`` may use the console."""
    check_origin(conn)
    try:
        auth.check(conn, settings)
    except Unauthorized:
        if settings.admin_token is not None:
            raise Unauthorized(
                "the console needs the admin token (SUPERAGENT_ADMIN_TOKEN): sign in on "
                f"{LOGIN}, or send it as 'Authorization: Bearer …'"
            ) from None
        raise Unauthorized(
            "without SUPERAGENT_ADMIN_TOKEN the console answers only on IP addresses and "
            "localhost; set the token to serve it by name"
        ) from None


def allowed(conn: HTTPConnection, settings: Settings) -> bool:
    try:
        check(conn, settings)
    except Unauthorized:
        return False
    return True


def token_matches(settings: Settings, presented: str) -> bool:
    return settings.admin_token is not None and auth.token_matches(settings, presented)


def sign_in(response: Response, conn: HTTPConnection, settings: Settings) -> None:
    """Give the browser the session cookie (only called once the token matched)."""
    assert settings.admin_token is not None
    response.set_cookie(
        auth.COOKIE,
        auth.cookie_value(settings.admin_token.get_secret_value()),
        max_age=COOKIE_MAX_AGE,
        path="/",  # the console and the chat it embeds
        httponly=True,  # out of reach of scripts
        samesite="strict",  # never sent by other sites' pages, websockets included
        secure=conn.url.scheme == "https",
    )


def sign_out(response: Response) -> None:
    # The chat's own sign-in scopes the same cookie to /chat: signing out ends both.
    for path in ("/", "/chat"):
        response.delete_cookie(auth.COOKIE, path=path, httponly=True, samesite="strict")


def next_page(raw: str | None) -> str:
    """Where to go after signing in: a console page of this site, never elsewhere."""
    if raw and raw.startswith(HOME) and "//" not in raw and "\\" not in raw:
        return raw
    return HOME
