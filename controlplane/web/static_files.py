"""A page's own script and style sheet, served as files: the pages' CSP forbids inline code."""

from __future__ import annotations

import functools
from importlib import resources

from starlette.responses import Response

from controlplane.errors import NotFound

_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}


@functools.cache
def read(package: str, name: str) -> bytes:
    """``static/NAME`` of ``package``, read once."""
    return (resources.files(package) / "static" / name).read_bytes()


def serve(package: str, name: str, allowed: frozenset[str], what: str) -> Response:
    """One of the ``allowed`` files of ``package``; NotFound for any other name."""
    if name not in allowed:
        raise NotFound(f"no {what} file {name!r}")
    suffix = name[name.rfind(".") :]
    return Response(
        read(package, name),
        media_type=_TYPES[suffix],
        headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"},
    )
