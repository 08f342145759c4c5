"""Access to the web chat: whether the other end of a chat request may chat, and what it is
called.

Every chat surface needs the admin token or a session made from it, verified for every
route by :mod:`.middleware`; this module only words the chat's refusals. Every
holder of the token is one principal, the admin: the ``name`` a caller gives labels who
said what, for display only, and never makes anyone else.
"""

from __future__ import annotations

import re

from starlette.requests import HTTPConnection

from controlplane.access import browsers
from controlplane.errors import InvalidInput
from controlplane.settings import Settings

DEFAULT_NAME = "admin"
_NAME = re.compile(r"^[\w.@+-]+(?: [\w.@+-]+)*$")
_NAME_MAX = 64


def check_origin(conn: HTTPConnection) -> None:
    """Refuse requests a browser sends on behalf of another site's page."""
    browsers.check_origin(conn, "chat")


def check(conn: HTTPConnection, settings: Settings) -> None:
    """Raise Unauthorized unless ``conn`` may use the chat."""
    browsers.require_admin(conn, "chat", "send it as 'Authorization: Bearer …' or sign in on /chat")


def display_name(raw: str | None) -> str:
    """The caller's name (``name`` parameter), checked; ``admin`` when not given."""
    name = (raw or "").strip() or DEFAULT_NAME
    if len(name) > _NAME_MAX or not _NAME.match(name):
        raise InvalidInput(
            f"name must be 1 to {_NAME_MAX} letters, digits, spaces or . @ + - _ characters"
        )
    return name
