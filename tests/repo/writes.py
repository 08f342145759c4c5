"""Which tables a control-plane module writes, read from its source (for
``test_table_writers.py``).

The source is parsed, not grepped: every string literal is read as Python joins it
(adjacent literals across lines are one string; an f-string's fields become ``{}``), with
its whitespace collapsed, and searched for a statement that changes a table: ``INSERT
INTO``, ``UPDATE`` (also ``UPDATE ONLY``, inside a ``WITH``), ``DELETE FROM``,
``TRUNCATE``, ``MERGE INTO`` and ``COPY … FROM``, with or without a schema, quotes or an
alias. asyncpg's ``copy_records_to_table`` and ``copy_to_table`` write their first
argument. ``DO UPDATE`` (an upsert's own table), ``FOR UPDATE`` and ``ON UPDATE`` are not
writes of another table. A write whose table is computed (an f-string field, a variable)
is reported as :data:`COMPUTED` (when its verb is in capitals, as this code base writes
SQL: "update {setting}" in a message is prose), so the test can ask for its tables to be
named.
Docstrings and comments are prose, not statements, and are left out.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

COMPUTED = "{}"  # the table of a write whose name is computed at run time

_VERBS = r"""
    (?<![\w.])
    (?:
        (?<!\bDO\s)(?<!\bFOR\s)(?<!\bKEY\s)(?<!\bON\s)UPDATE(?:\s+ONLY)?
      | INSERT\s+INTO
      | DELETE\s+FROM(?:\s+ONLY)?
      | TRUNCATE(?:\s+TABLE)?(?:\s+ONLY)?
      | MERGE\s+INTO
      | COPY
    )
"""
WRITE = re.compile(
    _VERBS
    + r"""
    \s+
    (?:"?public"?\.)?
    (?P<table>"?[A-Za-z_]\w*"?|\{\})
    (?P<after>\s*\S*)
    """,
    re.IGNORECASE | re.VERBOSE,
)
# A verb that ends its literal: the table comes from whatever is concatenated after it.
_DANGLING = re.compile(_VERBS + r"\s*$", re.IGNORECASE | re.VERBOSE)
_COPY_CALLS = {"copy_records_to_table", "copy_to_table"}


def tables_written(sql: str) -> set[str]:
    """The tables one string's statements write (lower case), :data:`COMPUTED` for one
    whose name is not in the string."""
    text = " ".join(sql.split())
    found = set()
    for match in WRITE.finditer(text):
        table = match["table"].strip('"').lower()
        verb = match.group(0).split()[0]
        if verb.upper() == "COPY" and not match["after"].strip().upper().startswith(("FROM", "(")):
            continue  # COPY x TO: a read
        if table == COMPUTED and not verb.isupper():
            continue  # prose ("update {setting}"): this code base writes SQL in capitals
        found.add(table)
    dangling = _DANGLING.search(text)
    if dangling and dangling.group(0).split()[0].isupper():
        found.add(COMPUTED)
    return found


def _literal(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(
            part.value
            if isinstance(part, ast.Constant) and isinstance(part.value, str)
            else COMPUTED
            for part in node.values
        )
    return None


def _prose(tree: ast.Module) -> set[int]:
    """The ids of the string nodes that are statements of their own (docstrings)."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, (ast.Constant, ast.JoinedStr))
    }


def _strings(tree: ast.Module) -> Iterator[str]:
    prose = _prose(tree)
    inside_fstrings = {
        id(part)
        for node in ast.walk(tree)
        if isinstance(node, ast.JoinedStr)
        for part in node.values
    }
    for node in ast.walk(tree):
        if id(node) in prose or id(node) in inside_fstrings:
            continue
        if isinstance(node, (ast.Constant, ast.JoinedStr)):
            text = _literal(node)
            if text is not None:
                yield text


def _copies(tree: ast.Module) -> Iterator[str]:
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _COPY_CALLS
        ):
            first = node.args[0] if node.args else None
            name = _literal(first) if first is not None else None
            yield COMPUTED if name is None or COMPUTED in name else name.lower()


def writes_in_source(source: str) -> set[str]:
    """Every table the module's source writes (see the module's doc)."""
    tree = ast.parse(source)
    found = set(_copies(tree))
    for text in _strings(tree):
        found |= tables_written(text)
    return found


def writes(root: Path, package: str = "controlplane") -> dict[str, set[str]]:
    """Module path (``controlplane/x/y.py``) → the tables it writes, for every module of
    ``package`` that writes one; the migrations (the schema's history) are left out."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if "/migrations/" in relative:
            continue
        tables = writes_in_source(path.read_text())
        if tables:
            found[relative] = tables
    return found
