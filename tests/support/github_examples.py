"""Real GitHub webhook payloads: the examples of api.github.com deliveries in the
``@octokit/webhooks-examples`` npm package (MIT), which ``scripts/bootstrap`` installs, pinned,
into ``.tools/github-webhooks``."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
INDEX = (
    ROOT
    / ".tools/github-webhooks/node_modules/@octokit/webhooks-examples/api.github.com/index.json"
)


@cache
def _index() -> list[dict[str, Any]]:
    if not INDEX.is_file():
        raise RuntimeError(
            f"GitHub's webhook examples are missing ({INDEX}): run scripts/bootstrap"
        )
    index = json.loads(INDEX.read_text())
    assert isinstance(index, list)
    return index


def examples() -> list[tuple[str, bytes]]:
    """Every example as ``(name, body)``: named ``<X-GitHub-Event>.<action>.<n>`` (``event``
    for an event without actions; ``n`` counts the event's examples), the body as sent."""
    return [
        (f"{event['name']}.{example.get('action', 'event')}.{n}", json.dumps(example).encode())
        for event in _index()
        for n, example in enumerate(event["examples"])
    ]


def example(event: str, action: str) -> dict[str, Any]:
    """The first example of ``event`` with ``action`` (a fresh copy, to change at will)."""
    for name, body in examples():
        if name.startswith(f"{event}.{action}."):
            payload: dict[str, Any] = json.loads(body)
            return payload
    raise LookupError(f"no example of {event}.{action}")
