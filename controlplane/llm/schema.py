"""Tool-call arguments checked against the JSON schema the model was shown.

Only the part of JSON Schema our tool specs use (``type``, ``properties``, ``required``,
``additionalProperties``, ``items``, ``enum``). A problem is returned as one sentence for
the model, so that it can correct its call; nothing here raises.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["arguments_problem", "specs_by_name"]

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
    "null": (type(None),),
}


def specs_by_name(specs: Sequence[Any]) -> dict[str, dict[str, Any]]:
    """Each function tool's parameter schema, by tool name."""
    return {
        spec["function"]["name"]: spec["function"].get("parameters") or {"type": "object"}
        for spec in specs
        if spec.get("type") == "function"
    }


def arguments_problem(
    name: str, arguments: str | Mapping[str, Any] | None, schemas: Mapping[str, Any]
) -> str | None:
    """What is wrong with a call to ``name`` with ``arguments``, or None when it fits."""
    if name not in schemas:
        return f"no tool {name!r}; the tools are {', '.join(sorted(schemas))}"
    if isinstance(arguments, Mapping):
        parsed: Any = dict(arguments)
    else:
        try:
            parsed = json.loads(arguments or "{}")
        except json.JSONDecodeError as exc:
            return f"arguments are not valid JSON: {exc.msg}"
    if not isinstance(parsed, dict):
        return "arguments must be a JSON object"
    return _problem(parsed, schemas[name], "arguments")


def _fits(value: Any, kind: str) -> bool:
    if kind in ("integer", "number") and isinstance(value, bool):
        return False  # JSON has no bool-as-number
    return isinstance(value, _TYPES.get(kind, (object,)))


def _problem(value: Any, schema: Mapping[str, Any], where: str) -> str | None:
    kinds = schema.get("type")
    if kinds is not None:
        allowed = [kinds] if isinstance(kinds, str) else list(kinds)
        if not any(_fits(value, kind) for kind in allowed):
            return f"{where} must be {' or '.join(allowed)}, not {_json_type(value)}"
    if "enum" in schema and value not in schema["enum"]:
        choices = ", ".join(json.dumps(choice) for choice in schema["enum"])
        return f"{where} must be one of {choices}"
    if isinstance(value, dict):
        properties: Mapping[str, Any] = schema.get("properties") or {}
        for key in schema.get("required") or []:
            if key not in value:
                return f"{where} lacks the required {key!r}"
        for key, item in value.items():
            if key in properties:
                problem = _problem(item, properties[key], f"{where}.{key}")
                if problem is not None:
                    return problem
            elif schema.get("additionalProperties") is False:
                return f"{where} has {key!r}, which is not one of {', '.join(properties)}"
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for index, item in enumerate(value):
            problem = _problem(item, schema["items"], f"{where}[{index}]")
            if problem is not None:
                return problem
    return None


def _json_type(value: Any) -> str:
    for name in _TYPES:
        if _fits(value, name):
            return name
    return type(value).__name__
