"""The policy's rule lists: ``[[commands]]`` (globs over the command line) and ``[[files]]``
(globs over absolute paths), each table an action for what it matches."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from endpointd.rules.reader import Reader
from endpointd.rules.tables import CommandRule, FileRule
from endpointd.rules.terms import ACTIONS, FILE_OPS, Action, FileOp

_RULE_KEYS = ("action", "match", "name")
_FILE_RULE_KEYS = ("action", "match", "ops", "name")


def command_rules(reader: Reader, data: Mapping[str, Any]) -> tuple[CommandRule, ...]:
    raw = data.get("commands", [])
    if not isinstance(raw, list) or not all(isinstance(c, dict) for c in raw):
        raise reader.fail("commands must be [[commands]] tables", None, "commands")
    names: set[str] = set()
    return tuple(_command_rule(reader, i, rule, names) for i, rule in enumerate(raw, start=1))


def _command_rule(reader: Reader, i: int, rule: Mapping[str, Any], names: set[str]) -> CommandRule:
    """The ``i``-th ``[[commands]]`` table; ``names`` collects the names seen so far."""
    table = "commands"
    reader.unknown(rule, _RULE_KEYS, table, i)
    action = _action(reader, table, i, rule)
    match = rule.get("match")
    if not isinstance(match, str) or not match.strip():
        raise reader.fail(
            f"commands[{i}].match must be a non-empty glob over the command line,"
            ' e.g. "git push *"',
            table,
            "match" if "match" in rule else None,
            i,
        )
    name = rule.get("name")
    if name is not None:
        if not _is_word(name):
            raise reader.fail(f"commands[{i}].name must be a non-empty word", table, "name", i)
        if name in names:
            raise reader.fail(f"two command rules are named {name!r}", table, "name", i)
        names.add(name)
    return CommandRule(index=i, action=action, match=match, name=name)


def file_rules(reader: Reader, data: Mapping[str, Any]) -> tuple[FileRule, ...]:
    raw = data.get("files", [])
    if not isinstance(raw, list) or not all(isinstance(r, dict) for r in raw):
        raise reader.fail("files must be [[files]] tables", None, "files")
    return tuple(_file_rule(reader, i, rule) for i, rule in enumerate(raw, start=1))


def _file_rule(reader: Reader, i: int, rule: Mapping[str, Any]) -> FileRule:
    reader.unknown(rule, _FILE_RULE_KEYS, "files", i)
    action = _action(reader, "files", i, rule)
    match = _file_match(reader, i, rule)
    ops = rule.get("ops", list(FILE_OPS))
    if (
        not isinstance(ops, list)
        or not ops
        or not all(isinstance(o, str) and o in FILE_OPS for o in ops)
    ):
        raise reader.fail(
            f"files[{i}].ops must list some of {', '.join(map(repr, FILE_OPS))}",
            "files",
            "ops",
            i,
        )
    name = rule.get("name")
    if name is not None and not _is_word(name):
        raise reader.fail(f"files[{i}].name must be a non-empty word", "files", "name", i)
    return FileRule(
        index=i,
        action=action,
        match=match,
        ops=tuple(cast(FileOp, o) for o in ops),
        name=name,
    )


def _file_match(reader: Reader, i: int, rule: Mapping[str, Any]) -> str:
    """A ``[[files]]`` glob, ``~/`` expanded: it is matched against absolute paths."""
    match = rule.get("match")
    if not isinstance(match, str) or not match.strip():
        raise reader.fail(
            f"files[{i}].match must be a non-empty glob over the absolute path,"
            ' e.g. "*/.github/workflows/*"',
            "files",
            "match" if "match" in rule else None,
            i,
        )
    if not (match.startswith(("/", "~/", "*"))):
        raise reader.fail(
            f"files[{i}].match must start with /, ~/ or * (it is matched against absolute paths)",
            "files",
            "match",
            i,
        )
    if match.startswith("~/"):
        match = str(reader.home) + match[1:]
    return match


def _action(reader: Reader, table: str, i: int, rule: Mapping[str, Any]) -> Action:
    action = rule.get("action")
    if action not in ACTIONS:
        raise reader.fail(
            f"{table}[{i}].action must be one of {', '.join(map(repr, ACTIONS))}, got {action!r}",
            table,
            "action" if "action" in rule else None,
            i,
        )
    return cast(Action, action)


def _is_word(name: object) -> bool:
    return isinstance(name, str) and bool(name.strip()) and not any(c.isspace() for c in name)
