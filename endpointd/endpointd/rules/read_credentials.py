"""The policy's ``[credentials.NAME]`` tables: which programs may receive each credential,
for which hosts it is used and with which header."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from endpointd.rules.credentials import NAME_RULE, valid_name
from endpointd.rules.reader import Reader
from endpointd.rules.tables import CredentialScope
from endpointd.rules.terms import DEFAULT_HEADER

_SCOPE_KEYS = ("allow", "hosts", "header")


def credential_scopes(reader: Reader, data: Mapping[str, Any]) -> dict[str, CredentialScope]:
    raw = data.get("credentials", {})
    if not isinstance(raw, dict):
        raise reader.fail("credentials must be [credentials.NAME] tables", None, "credentials")
    return {name: _scope(reader, name, scope) for name, scope in raw.items()}


def _scope(reader: Reader, name: str, scope: object) -> CredentialScope:
    table = f"credentials.{name}"
    if not valid_name(name):
        raise reader.fail(
            f"invalid credential name {name!r} in [{table}]: use {NAME_RULE}", table, None
        )
    if not isinstance(scope, dict):
        raise reader.fail(f"[{table}] must be a table with `allow = [...]`", table, None)
    reader.unknown(scope, _SCOPE_KEYS, table)
    allow = scope.get("allow")
    if not isinstance(allow, list) or not all(isinstance(g, str) and g.strip() for g in allow):
        raise reader.fail(
            f'{table}.allow must be a list of command globs, e.g. ["git *"]',
            table,
            "allow" if "allow" in scope else None,
        )
    header = _header(reader, table, scope)
    return CredentialScope(
        allow=tuple(allow), hosts=reader.hosts(scope, "hosts", table), header=header
    )


def _header(reader: Reader, table: str, scope: Mapping[str, Any]) -> str:
    """The header line an http delivery adds: one line, ``{secret}`` exactly once."""
    header = scope.get("header", DEFAULT_HEADER)
    if (
        not isinstance(header, str)
        or header.count("{secret}") != 1
        or not re.match(r"[A-Za-z0-9-]+: ", header)
        or any(c in header for c in "\r\n\0")
    ):
        raise reader.fail(
            f"{table}.header must be one header line holding {{secret}} once,"
            f" e.g. {json.dumps(DEFAULT_HEADER)}",
            table,
            "header",
        )
    return header
