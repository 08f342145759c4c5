"""Who is on the other end of a chat request, and whether they may chat at all.

Every console user holds the same credential, the admin token (``SUPERAGENT_ADMIN_TOKEN``):
presented as ``Authorization: Bearer``, as a ``token`` query parameter, or as the session
cookie the chat page sets after a sign-in. The ``name`` a caller gives only labels who said
what (actor ``web:<name>``); it is not an identity check, because there is only one key.

Without an admin token (the development default, listening on 127.0.0.1) no token is
asked for. Two browser attacks are still refused then, because a chat that makes an agent
run code must not be reachable from any web page the developer happens to visit:

* cross-site WebSocket hijacking: a browser's ``Origin`` must be this very host;
* DNS rebinding (an attacker's domain resolving to 127.0.0.1): the ``Host`` must be an IP
  address or ``localhost``. Serving under a DNS name needs the admin token.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
from urllib.parse import urlsplit

from starlette.requests import HTTPConnection

from controlplane.errors import InvalidInput, Unauthorized
from controlplane.settings import Settings

COOKIE = "superagent_chat"
DEFAULT_NAME = "admin"
_NAME = re.compile(r"^[\w.@+-]+(?: [\w.@+-]+)*$")
_NAME_MAX = 64


def cookie_value(token: str) -> str:
    """The session cookie for ``token``: derived from it, so the cookie is not the token
    itself, opens only the chat, and dies when the token is rotated."""
    return hmac.new(token.encode(), b"superagent webchat session v1", hashlib.sha256).hexdigest()


def _same(presented: str, expected: str) -> bool:
    # Bytes: compare_digest refuses str with non-ASCII characters.
    return hmac.compare_digest(presented.encode(), expected.encode())


def _presented(conn: HTTPConnection, token: str) -> bool:
    header = conn.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and _same(value.strip(), token):
        return True
    query = conn.query_params.get("token")
    if query is not None and _same(query, token):
        return True
    cookie = conn.cookies.get(COOKIE)
    return cookie is not None and _same(cookie, cookie_value(token))


def _host_name(host_header: str) -> str:
    return urlsplit(f"//{host_header}").hostname or ""


def _local_host(host_header: str) -> bool:
    name = _host_name(host_header)
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def check_origin(conn: HTTPConnection) -> None:
    """Refuse requests a browser sends on behalf of another site's page."""
    origin = conn.headers.get("origin")
    if origin is None:
        return  # not a browser (or a same-origin GET)
    # Behind a proxy the browser's host may arrive as X-Forwarded-Host; a page on another
    # site cannot set that header on a websocket or a simple request.
    hosts = {conn.headers.get("host", ""), *conn.headers.get("x-forwarded-host", "").split(",")}
    # Any Origin, "null" (sandboxed frames) included, must name this host.
    if urlsplit(origin).netloc.lower() not in {h.strip().lower() for h in hosts if h.strip()}:
        raise Unauthorized("cross-origin chat requests are refused")


def check(conn: HTTPConnection, settings: Settings) -> None:
    """Raise Unauthorized unless ``conn`` may use the chat."""
    check_origin(conn)
    host = conn.headers.get("host", "")
    if settings.admin_token is not None:
        if not _presented(conn, settings.admin_token.get_secret_value()):
            raise Unauthorized(
                "the chat needs the admin token (SUPERAGENT_ADMIN_TOKEN): send it as "
                "'Authorization: Bearer …' or sign in on /chat"
            )
        return
    if not _local_host(host):
        raise Unauthorized(
            f"without SUPERAGENT_ADMIN_TOKEN the chat answers only on IP addresses and "
            f"localhost, not {_host_name(host)!r}; set the token to serve it by name"
        )


def token_matches(settings: Settings, presented: str) -> bool:
    if settings.admin_token is None:
        return True
    return _same(presented, settings.admin_token.get_secret_value())


def display_name(raw: str | None) -> str:
    """The caller's name (``name`` parameter), checked; ``admin`` when not given."""
    name = (raw or "").strip() or DEFAULT_NAME
    if len(name) > _NAME_MAX or not _NAME.match(name):
        raise InvalidInput(
            f"name must be 1 to {_NAME_MAX} letters, digits, spaces or . @ + - _ characters"
        )
    return name
