"""The secrets in the owner's harness logins, for the redactor.

A harness run may read its harness's login (:mod:`endpointd.harness.stores` links it into
the run's store, read-only), so what the run prints may hold its tokens: a prompt-injected
run can ``cat`` it, as it can print a key delivered by env. The redactor masks them in
everything that leaves the device, as it masks the stored credentials; this is defence in
depth, never the boundary (the login stays unreadable to every other command).

Which values: in each login file (and Qwen Code's ``settings.json``, which may hold a key)
that is a JSON object, every string of 8 characters or more under a key whose name says it
is a secret (``accessToken``, ``refresh_token``, ``apiKey``, ``OPENAI_API_KEY``: the names
:func:`endpointd.secrets.secret_looking` knows). The files are the owner's, which no
command can write; each is read again only when it changes, and at most 1 MiB of it.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

from endpointd.rules.harnesses import HARNESSES, owner_logins
from endpointd.secrets import MIN_SECRET_CHARS, secret_looking

__all__ = ["login_secrets"]

_MAX_BYTES = 1 << 20
_cache: dict[str, tuple[tuple[int, int, int], tuple[bytes, ...]]] = {}
_lock = threading.Lock()


def login_secrets(home: Path, environ: Mapping[str, str] | None = None) -> dict[str, bytes]:
    """The secret values of every harness's login files (names are labels only)."""
    environ = os.environ if environ is None else environ
    found: dict[str, bytes] = {}
    for name, spec in HARNESSES.items():
        for path in owner_logins(spec, home, environ):
            for index, value in enumerate(_values(path)):
                found[f"endpointd:harness-login:{name}:{path.name}:{index}"] = value
    return found


def _values(path: Path) -> tuple[bytes, ...]:
    try:
        st = os.stat(path)
    except OSError:
        return ()
    stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
    key = str(path)
    with _lock:
        known = _cache.get(key)
        if known is not None and known[0] == stamp:
            return known[1]
    values: tuple[bytes, ...] = ()
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read(_MAX_BYTES))
        values = tuple(dict.fromkeys(v.encode() for v in _secret_strings(data, "")))
    except (OSError, ValueError, RecursionError):
        values = ()
    with _lock:
        _cache[key] = (stamp, values)
    return values


def _secret_strings(node: object, name: str, depth: int = 0) -> Iterator[str]:
    if depth > 16:
        return
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _secret_strings(value, str(key), depth + 1)
    elif isinstance(node, list):
        for value in node:
            yield from _secret_strings(value, name, depth + 1)
    elif isinstance(node, str) and secret_looking(name) and len(node.strip()) >= MIN_SECRET_CHARS:
        yield node
