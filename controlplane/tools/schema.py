"""OpenAI function schemas generated from a tool's pydantic argument model, in strict mode.

Strict mode decodes the model's arguments against the schema, and accepts only a subset of
JSON Schema: every object closed (``additionalProperties: false``) and listing every
property in ``required``, an optional property written as one that may be null, no
``$ref`` to shared definitions, and no keywords it does not know (``title``, ``default``,
string lengths). Numeric bounds that are only the wire's limits are left out too: they
cost prompt tokens and guide nothing. The pydantic model stays the authority: what strict
mode cannot say (a string's length, an id's prefix) is still checked when the call is
validated.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

__all__ = ["at", "function_spec", "parameters"]

# Keywords strict mode refuses or ignores; the model checks them instead.
_DROPPED = frozenset({"title", "default", "maxLength", "minLength"})
_WIRE = 1 << 20  # numeric bounds this large are wire limits, not guidance (_wire_bound)
_FIRST = ("type", "description")
_LAST = ("items", "properties", "required", "additionalProperties")


def function_spec(name: str, description: str, model: type[BaseModel]) -> dict[str, Any]:
    """The tool as the model is shown it."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": parameters(model),
            "strict": True,
        },
    }


def parameters(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s JSON schema, made strict: closed, all required, inlined."""
    schema = model.model_json_schema()
    definitions: dict[str, Any] = schema.pop("$defs", {})
    # A model's docstring is for the code's reader; what the model is told is in the
    # tool's and the fields' descriptions.
    schema.pop("description", None)
    for definition in definitions.values():
        definition.pop("description", None)
    return _strict(schema, definitions)


def at(schema: dict[str, Any], loc: tuple[int | str, ...]) -> dict[str, Any]:
    """The part of a strict ``schema`` at ``loc`` (field names and list indexes); {} if none."""
    node = schema
    for step in loc:
        if isinstance(step, int):
            node = node.get("items") or {}
        else:
            node = (node.get("properties") or {}).get(step) or {}
    return node


def _strict(node: dict[str, Any], definitions: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in node:
        target = definitions[node["$ref"].rsplit("/", 1)[-1]]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    out = {k: v for k, v in node.items() if k not in _DROPPED and not _wire_bound(k, v)}
    if "anyOf" in out:
        branches = [_strict(branch, definitions) for branch in out.pop("anyOf")]
        out = _union(branches, out)
    if "properties" in out:
        required = set(out.get("required") or ())
        properties = {}
        for key, value in out["properties"].items():
            field = _strict(value, definitions)
            # Strict mode wants every property: one the model may leave out may be null.
            properties[key] = field if key in required else _nullable(field)
        out["properties"] = properties
        out["required"] = list(properties)
        out["additionalProperties"] = False
    if isinstance(out.get("items"), dict):
        out["items"] = _strict(out["items"], definitions)
    return _ordered(out)


def _wire_bound(key: str, value: Any) -> bool:
    """A numeric bound no sensible call comes near (an int32, a 1 TiB offset): the wire's
    limit, still checked, but 10 to 15 prompt tokens each that tell the model nothing."""
    return key in ("maximum", "minimum") and isinstance(value, int) and abs(value) >= _WIRE


def _ordered(node: dict[str, Any]) -> dict[str, Any]:
    """What a field is first, its parts last: the order a reader of the prompt expects."""
    first = [k for k in _FIRST if k in node]
    last = [k for k in _LAST if k in node]
    middle = [k for k in node if k not in _FIRST and k not in _LAST]
    return {k: node[k] for k in (*first, *middle, *last)}


def _union(branches: list[dict[str, Any]], outer: dict[str, Any]) -> dict[str, Any]:
    """``X | None`` as ``X`` with ``"type": [..., "null"]``; any other union as anyOf."""
    others = [b for b in branches if b != {"type": "null"}]
    if len(others) == 1 and len(branches) == 2 and isinstance(others[0].get("type"), str):
        return {**_nullable(others[0]), **outer}
    return {**outer, "anyOf": branches}


def _nullable(node: dict[str, Any]) -> dict[str, Any]:
    kind = node.get("type")
    if kind == "null" or (isinstance(kind, list) and "null" in kind):
        return node
    if any(branch.get("type") == "null" for branch in node.get("anyOf") or ()):
        return node
    if isinstance(kind, str):
        out = {**node, "type": [kind, "null"]}
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
        return out
    return {"anyOf": [node, {"type": "null"}]}
