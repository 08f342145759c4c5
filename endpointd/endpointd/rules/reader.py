"""Reading ``policy.toml`` one typed value at a time, with errors that name the line.

:class:`Reader` carries the file's path, text and the home ``~`` stands for; each section
reader (:mod:`endpointd.rules.parser` and the ``read_*`` modules) asks it for a list of
paths, a choice, a table, host names or variable names, and raises what
:meth:`Reader.fail` makes: a :class:`~endpointd.rules.errors.PolicyError` with the best
line number :func:`locate` can find (tomllib gives values, not positions).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from endpointd.rules.errors import PolicyError

_HOST = re.compile(
    r"(\*\.)?[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*(:[0-9]{1,5})?\Z"
)
VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(?:#.*)?$")


def expand_path(raw: str, home: Path | None = None) -> Path:
    """``~`` and ``~/…`` expanded against ``home``; normalised (``..`` folded) if absolute."""
    home = Path.home() if home is None else home
    if raw == "~":
        text = str(home)
    elif raw.startswith("~/"):
        text = str(home) + raw[1:]
    else:
        text = os.path.expanduser(raw)
    return Path(os.path.normpath(text)) if os.path.isabs(text) else Path(text)


def _table_name(raw: str) -> str:
    return ".".join(part.strip().strip("\"'") for part in raw.split("."))


def locate(text: str, table: str | None, key: str | None, nth: int = 1) -> int | None:
    """Best-effort line number of ``key`` in ``table`` (the nth array-of-tables entry)."""
    lines = text.splitlines()
    start, seen = 0, 0
    if table is not None:
        for i, line in enumerate(lines):
            m = _HEADER.match(line)
            if m and _table_name(m.group(2)) == table:
                seen += 1
                if seen == nth:
                    start = i + 1
                    break
        else:
            return None
        if key is None:
            return start
    if key is None:
        return None
    pattern = re.compile(rf"""^\s*["']?{re.escape(key)}["']?\s*=""")
    for i in range(start, len(lines)):
        if _HEADER.match(lines[i]):
            if table is not None:
                return None
            continue
        if pattern.match(lines[i]):
            return i + 1
    return None


class Reader:
    def __init__(self, path: Path, text: str, home: Path) -> None:
        self.path = path
        self.text = text
        self.home = home

    def fail(
        self, message: str, table: str | None = None, key: str | None = None, nth: int = 1
    ) -> PolicyError:
        return PolicyError(self.path, message, locate(self.text, table, key, nth))

    def unknown(
        self, data: Mapping[str, Any], known: Sequence[str], table: str | None, nth: int = 1
    ) -> None:
        for key in data:
            if key not in known:
                where = f" in [{table}]" if table else ""
                raise self.fail(
                    f"unknown key {key!r}{where}; known keys: {', '.join(known)}",
                    table,
                    key,
                    nth,
                )

    def path_list(self, data: Mapping[str, Any], key: str) -> tuple[tuple[str, Path], ...]:
        value = data.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(f"{key} must be a list of paths (strings)", None, key)
        out = []
        for raw in value:
            if not raw.strip():
                raise self.fail(f"{key} contains an empty path", None, key)
            expanded = expand_path(raw, self.home)
            if not expanded.is_absolute():
                raise self.fail(
                    f"{key}: {raw!r} is not an absolute path (write /… or ~/…)", None, key
                )
            out.append((raw, expanded))
        return tuple(out)

    def choice(
        self, data: Mapping[str, Any], key: str, choices: Sequence[str], default: str
    ) -> str:
        value = data.get(key, default)
        if value not in choices:
            raise self.fail(
                f"{key} must be one of {', '.join(map(repr, choices))}, got {value!r}", None, key
            )
        return str(value)

    def table(self, data: Mapping[str, Any], key: str, known: Sequence[str]) -> Mapping[str, Any]:
        value = data.get(key, {})
        if not isinstance(value, dict):
            raise self.fail(f"{key} must be a [{key}] table", None, key)
        self.unknown(value, known, key)
        return value

    def hosts(self, data: Mapping[str, Any], key: str, table: str) -> tuple[str, ...]:
        value = data.get(key, [])
        if not isinstance(value, list) or not all(isinstance(h, str) for h in value):
            raise self.fail(f"{table}.{key} must be a list of host names", table, key)
        for host in value:
            if not _HOST.match(host):
                raise self.fail(
                    f"{table}.{key}: {host!r} is not a host name (write github.com,"
                    " *.example.com or host:port; no scheme, no path)",
                    table,
                    key,
                )
        return tuple(h.lower() for h in value)

    def names(self, data: Mapping[str, Any], key: str) -> tuple[str, ...]:
        value = data.get(key, [])
        if not isinstance(value, list) or not all(
            isinstance(v, str) and VARIABLE.match(v) for v in value
        ):
            raise self.fail(f"env.{key} must be a list of variable names", "env", key)
        return tuple(value)
