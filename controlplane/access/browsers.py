"""What a browser may not be made to reach: the two guards in front of every credential.

Two browser attacks are refused before any credential is looked at:

* cross-site requests: a browser's ``Origin`` must be this very host;
* DNS rebinding (an attacker's domain resolving to 127.0.0.1): on a loopback bind, the
  ``Host`` must be an IP address, ``localhost``, or a name in ``http.allowed_hosts``.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from starlette.requests import HTTPConnection

from controlplane.access import authentication
from controlplane.access.admin_token import loopback_host
from controlplane.errors import Unauthorized
from controlplane.settings import Settings


def _host_name(host_header: str) -> str:
    return (urlsplit(f"//{host_header}").hostname or "").lower()


def check_host(conn: HTTPConnection, settings: Settings) -> None:
    """Refuse a ``Host`` that a DNS-rebinding page would send."""
    names = {n.strip().lower() for n in settings.http.allowed_hosts.split(",") if n.strip()}
    if not names and not loopback_host(settings.http.host):
        return  # a deployment served by name behind its proxy
    name = _host_name(conn.headers.get("host", ""))
    if name in names or name == "localhost" or name.endswith(".localhost"):
        return
    try:
        ipaddress.ip_address(name)
    except ValueError:
        raise Unauthorized(
            f"this control plane is not served as {name!r}; add the name to "
            "SUPERAGENT_HTTP__ALLOWED_HOSTS to serve it by name"
        ) from None


def check_origin(conn: HTTPConnection, surface: str = "") -> None:
    """Refuse requests a browser sends on behalf of another site's page (``surface``
    names what was asked for, in the refusal: "console", "chat")."""
    origin = conn.headers.get("origin")
    if origin is None:
        return  # not a browser (or a same-origin GET)
    # Behind a proxy the browser's host may arrive as X-Forwarded-Host; a page on another
    # site cannot set that header on a websocket or a simple request.
    hosts = {conn.headers.get("host", ""), *conn.headers.get("x-forwarded-host", "").split(",")}
    # Any Origin, "null" (sandboxed frames) included, must name this host.
    if urlsplit(origin).netloc.lower() not in {h.strip().lower() for h in hosts if h.strip()}:
        what = f"cross-origin {surface} requests" if surface else "cross-origin requests"
        raise Unauthorized(f"{what} are refused")


def require_admin(conn: HTTPConnection, surface: str, how: str) -> None:
    """Raise Unauthorized unless ``conn`` comes from this site and holds the admin token
    or a session made from it; ``how`` tells a refused caller the ways to present it."""
    check_origin(conn, surface)
    try:
        authentication.principal(conn)
    except Unauthorized:
        raise Unauthorized(
            f"the {surface} needs the admin token (SUPERAGENT_ADMIN_TOKEN): {how}"
        ) from None
