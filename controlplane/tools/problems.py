"""What is wrong with a tool call's arguments, as one sentence the model can act on.

A pydantic ``ValidationError`` lists every problem in pydantic's words; the model gets the
first one, naming the field as it was shown it (``arguments.verdicts[0].matches``) and
what the schema it saw wants there, so that it can correct its call.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails, PydanticCustomError

from controlplane.tools.schema import at

__all__ = ["FIELD", "RULE", "field_problem", "rule_problem", "sentence", "where"]

FIELD = "tool_field"  # a field's problem: the message follows the field's name
RULE = "tool_rule"  # a rule across fields: the message names what it is about

_JSON_TYPES: tuple[tuple[str, tuple[type, ...]], ...] = (
    ("string", (str,)),
    ("integer", (int,)),
    ("number", (int, float)),
    ("boolean", (bool,)),
    ("object", (dict,)),
    ("array", (list, tuple)),
    ("null", (type(None),)),
)
_TYPE_ERRORS = frozenset({"int_from_float", "none_required", "is_instance_of"})
_BOUNDS = frozenset({"greater_than", "greater_than_equal", "less_than", "less_than_equal"})


def field_problem(message: str) -> PydanticCustomError:
    """Raise it from a field validator: "arguments.thread" + " " + ``message``."""
    return PydanticCustomError(FIELD, "{message}", {"message": message})


def rule_problem(message: str) -> PydanticCustomError:
    """Raise it from a model validator: ``message`` as it is."""
    return PydanticCustomError(RULE, "{message}", {"message": message})


def sentence(error: ValidationError, schema: dict[str, Any]) -> str:
    """The first problem of ``error`` against the strict ``schema`` the model was shown;
    a missing field before anything else, as the model most likely forgot it."""
    errors = error.errors(include_url=False)
    first = next((e for e in errors if e["type"] == "missing"), errors[0])
    return _describe(first, schema)


def where(loc: tuple[int | str, ...]) -> str:
    """``("verdicts", 0, "matches")`` as ``arguments.verdicts[0].matches``."""
    return "arguments" + "".join(f"[{s}]" if isinstance(s, int) else f".{s}" for s in loc)


def _describe(error: ErrorDetails, schema: dict[str, Any]) -> str:
    kind = error["type"]
    loc = tuple(error["loc"])
    context = error.get("ctx") or {}
    node = at(schema, loc)
    if kind == "missing":
        return f"{where(loc[:-1])} lacks the required {loc[-1]!r}"
    if kind == "extra_forbidden":
        known = at(schema, loc[:-1]).get("properties") or {}
        return f"{where(loc[:-1])} has {loc[-1]!r}, which is not one of {', '.join(known)}"
    if kind == FIELD:
        return f"{where(loc)} {context['message']}"
    if kind == RULE:
        return str(context["message"])
    if kind in ("literal_error", "enum") and "enum" in node:
        choices = ", ".join(json.dumps(c) for c in node["enum"] if c is not None)
        return f"{where(loc)} must be one of {choices}"
    if kind.endswith("_type") or kind in _TYPE_ERRORS:
        return f"{where(loc)} must be {' or '.join(_types(node))}, not {_json_type(error)}"
    if kind == "string_too_long":
        return f"{where(loc)} is longer than {context['max_length']} characters"
    if kind == "too_long":
        return f"{where(loc)} has more than {context['max_length']} items"
    if kind in _BOUNDS:
        low, high = node.get("minimum"), node.get("maximum")
        if low is not None and high is not None:
            return f"{where(loc)} must be an integer from {low} to {high}"
        # The bound broken, from the error itself: a wire limit is not in the schema.
        words = {"ge": "at least", "gt": "more than", "le": "at most", "lt": "less than"}
        broken = [f"{words[key]} {context[key]}" for key in words if key in context]
        return f"{where(loc)} must be {' and '.join(broken) or error['msg']}"
    return f"{where(loc)}: {error['msg']}"


def _types(node: dict[str, Any]) -> list[str]:
    kind = node.get("type")
    if isinstance(kind, str):
        return [kind]
    if isinstance(kind, list):
        return [str(k) for k in kind]
    branches = [_types(branch) for branch in node.get("anyOf") or ()]
    return [k for kinds in branches for k in kinds] or ["something else"]


def _json_type(error: ErrorDetails) -> str:
    value = error.get("input")
    for name, kinds in _JSON_TYPES:
        if isinstance(value, kinds) and not (isinstance(value, bool) and name != "boolean"):
            return name
    return type(value).__name__
