"""Reading a webhook's raw body and its JSON, and answering it, the same way on every channel.

The body is refused (413) as soon as it passes the channel's limit, whether or not a
Content-Length announced it (a chunked body carries none). Its JSON is parsed only after
the signature was checked, and anything unparseable (bad UTF-8, bad JSON, nesting deep
enough to exhaust the parser's recursion) is a 400, never a 500.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request

from controlplane.errors import InvalidInput, PayloadTooLarge
from controlplane.ingest.intake import Ingested


def _size(limit: int) -> str:
    return f"{limit >> 20} MB" if limit >= 1 << 20 else f"{limit >> 10} KB"


async def read_body(request: Request, limit: int, why: str = "") -> bytes:
    """The raw body, refused past ``limit`` bytes (``why`` explains the limit, if given)."""
    too_large = f"the body is over {_size(limit)}" + (f", {why}" if why else "")
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise PayloadTooLarge(too_large)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(too_large)
        chunks.append(chunk)
    return b"".join(chunks)


def parse_json(raw: bytes | str, what: str = "the body") -> Any:
    """``raw`` as JSON; InvalidInput naming ``what`` if it is not."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError
        raise InvalidInput(f"{what} is not JSON ({type(exc).__name__})") from None


def json_object(raw: bytes | str, what: str = "the body") -> dict[str, Any]:
    value = parse_json(raw, what)
    if not isinstance(value, dict):
        raise InvalidInput(f"{what} is not a JSON object")
    return value


def recorded(result: Ingested) -> dict[str, Any]:
    """What a webhook's answer says about the trigger it recorded (or found recorded)."""
    return {
        "id": result.trigger_id,
        "thread": result.thread_id,
        "verdict": result.verdict,
        "route": result.route,
        "duplicate": result.duplicate,
    }
