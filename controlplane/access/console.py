"""Access to the console: whoever holds the admin token or a session made from it.

The rule itself is :mod:`.middleware` (in front of every route), :mod:`.authentication`
and :mod:`.browsers`; this module words the console's refusals, and signs
a browser in and out. The session cookie is scoped to the whole site, so one sign-in
opens both the console and the chat it embeds.
"""

from __future__ import annotations

from starlette.requests import HTTPConnection
from starlette.responses import Response

from controlplane.access import authentication, browsers, sessions
from controlplane.errors import Unauthorized
from controlplane.settings import Settings

HOME = "/console"
LOGIN = "/console/login"
_NEXT = (HOME, "/chat")  # where a sign-in may lead


def check_origin(conn: HTTPConnection) -> None:
    """Refuse what a browser sends on behalf of another site's page."""
    browsers.check_origin(conn, "console")


def check(conn: HTTPConnection, settings: Settings) -> None:
    """Raise Unauthorized, saying what to do, unless ``conn`` may use the console."""
    browsers.require_admin(
        conn, "console", f"sign in on {LOGIN}, or send it as 'Authorization: Bearer …'"
    )


def allowed(conn: HTTPConnection, settings: Settings) -> bool:
    try:
        check(conn, settings)
    except Unauthorized:
        return False
    return True


def sign_in(response: Response, conn: HTTPConnection, secret: str, settings: Settings) -> None:
    sessions.set_cookie(response, conn, secret, authentication.session_ttl(settings))


def sign_out(response: Response) -> None:
    sessions.clear_cookie(response)


def next_page(raw: str | None) -> str:
    """Where to go after signing in: a console or chat page of this site, never elsewhere."""
    if (
        raw
        and raw.startswith(_NEXT)
        and "//" not in raw
        and "\\" not in raw
        and "\n" not in raw
        and "\r" not in raw
    ):
        return raw
    return HOME
