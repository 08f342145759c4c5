"""The tool registry: schemas generated from argument models are valid for OpenAI's strict
mode, and a call is checked against the model before its handler runs, with one sentence
back for the model whenever it is not."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import pytest
from pydantic import Field

from controlplane.router.tools.toolbox import SUBAGENT_SPEC
from controlplane.router.tools.toolbox import TOOL_SPECS as ROUTER_SPECS
from controlplane.tools.fields import NON_BLANK, Arguments, TicketId
from controlplane.tools.registry import Refusal, Refused, Registry
from controlplane.workers.tools.toolbox import TOOL_SPECS as WORKER_SPECS
from superagent_shared.ids import new_id


@dataclass
class Desk:
    """A toolbox's state, as the handlers see it."""

    seen: list[Any] = field(default_factory=list)


class Step(Arguments):
    name: str
    done: bool


class Plan(Arguments):
    ticket: TicketId
    title: Annotated[str, Field(max_length=20, description="What it is called."), NON_BLANK]
    steps: list[Step]
    mode: Literal["quick", "careful"]
    retries: Annotated[int | None, Field(ge=0, le=3, description="How often to retry.")] = None
    note: str | None = None
    offset: Annotated[int | None, Field(ge=0, le=1 << 40)] = None  # a wire limit


class Nothing(Arguments):
    pass


tools = Registry[Desk, dict[str, Any]]()


@tools.tool("plan", "Plan some work.")
async def plan(desk: Desk, args: Plan) -> dict[str, Any]:
    desk.seen.append(args)
    return {"planned": args.title}


@tools.tool("refuse", "Always refused.")
async def refuse(desk: Desk, args: Nothing) -> dict[str, Any]:
    raise Refused("not today")


def _plan(**changes: Any) -> dict[str, Any]:
    plan = {
        "ticket": new_id("tkt"),
        "title": "tidy",
        "steps": [{"name": "sweep", "done": False}],
        "mode": "quick",
    }
    return {**plan, **changes}


def _schemas(node: dict[str, Any], where: str = "parameters") -> Iterator[tuple[str, Any]]:
    """Every schema in ``node`` (itself, its properties', items' and branches'), by place."""
    yield where, node
    for key, value in (node.get("properties") or {}).items():
        yield from _schemas(value, f"{where}.{key}")
    if "items" in node:
        yield from _schemas(node["items"], f"{where}[]")
    for index, branch in enumerate(node.get("anyOf") or ()):
        yield from _schemas(branch, f"{where}|{index}")


ALL_SPECS = [*tools.specs(), *ROUTER_SPECS, SUBAGENT_SPEC, *WORKER_SPECS]


@pytest.mark.parametrize("spec", ALL_SPECS, ids=lambda s: s["function"]["name"])
def test_every_schema_is_valid_for_strict_mode(spec: dict[str, Any]) -> None:
    function = spec["function"]
    assert spec["type"] == "function"
    assert function["strict"] is True
    assert function["description"]
    parameters = function["parameters"]
    assert parameters["type"] == "object"
    for where, node in _schemas(parameters):
        for word in ("$ref", "$defs", "title", "default", "maxLength", "minLength"):
            assert word not in node, (function["name"], where, word)
        if node.get("type") == "object" or "properties" in node:
            assert node["additionalProperties"] is False, where
            assert node["required"] == list(node["properties"]), where
    assert "$ref" not in json.dumps(parameters)


def test_an_optional_field_may_be_null_and_keeps_its_description_and_limits() -> None:
    (spec,) = [s for s in tools.specs() if s["function"]["name"] == "plan"]
    properties = spec["function"]["parameters"]["properties"]
    assert properties["retries"] == {
        "type": ["integer", "null"],
        "description": "How often to retry.",
        "minimum": 0,
        "maximum": 3,
    }
    assert properties["note"] == {"type": ["string", "null"]}
    # A wire limit (1 TiB) guides no call: not shown (prompt tokens), still checked.
    assert properties["offset"] == {"type": ["integer", "null"], "minimum": 0}
    assert properties["title"] == {"type": "string", "description": "What it is called."}
    assert properties["mode"] == {"type": "string", "enum": ["quick", "careful"]}
    assert properties["steps"]["items"]["required"] == ["name", "done"]


async def test_valid_arguments_reach_the_handler_typed() -> None:
    desk = Desk()
    sent = _plan(retries=2)
    for raw in (sent, json.dumps(sent)):
        assert await tools.dispatch(desk, "plan", raw) == {"planned": "tidy"}
    first, second = desk.seen
    assert first == second
    assert isinstance(first, Plan)
    assert isinstance(first.steps[0], Step)
    assert (first.retries, first.note, first.steps[0].done) == (2, None, False)
    # Left out or null: an optional field is None either way.
    assert await tools.dispatch(desk, "plan", _plan(note=None, retries=None)) == {"planned": "tidy"}


@pytest.mark.parametrize(
    ("name", "raw", "error"),
    [
        ("launch", "{}", "no tool 'launch'; the tools are plan, refuse"),
        ("plan", "{not json", "arguments are not valid JSON: Expecting property name"),
        ("plan", "[1, 2]", "arguments must be a JSON object"),
        ("plan", _plan(title=5), "arguments.title must be string, not integer"),
        ("plan", {k: v for k, v in _plan().items() if k != "mode"}, "lacks the required 'mode'"),
        (
            "plan",
            _plan(colour="red"),
            "arguments has 'colour', which is not one of ticket, title, steps, mode, retries, "
            "note, offset",
        ),
        ("plan", _plan(title="   "), "arguments.title must not be empty"),
        ("plan", _plan(title="x" * 21), "arguments.title is longer than 20 characters"),
        ("plan", _plan(ticket="tkt_1"), "arguments.ticket must be a tkt_ id, not 'tkt_1'"),
        ("plan", _plan(mode="slow"), 'arguments.mode must be one of "quick", "careful"'),
        ("plan", _plan(retries=4), "arguments.retries must be an integer from 0 to 3"),
        ("plan", _plan(offset=1 << 41), "arguments.offset must be at most 1099511627776"),
        ("plan", _plan(retries=True), "arguments.retries must be integer or null, not boolean"),
        ("plan", _plan(retries="2"), "arguments.retries must be integer or null, not string"),
        (
            "plan",
            _plan(steps=[{"name": "a", "done": "yes"}]),
            "arguments.steps[0].done must be boolean, not string",
        ),
        ("plan", _plan(steps=[{"name": "a"}]), "arguments.steps[0] lacks the required 'done'"),
        ("refuse", {}, "not today"),
    ],
)
async def test_a_bad_call_is_refused_in_one_sentence(name: str, raw: Any, error: str) -> None:
    desk = Desk()
    refused = await tools.dispatch(desk, name, raw)
    assert isinstance(refused, Refusal)
    assert error in refused.error, refused.error
    assert "\n" not in refused.error
    assert desk.seen == []  # the handler never ran


def test_what_the_model_sent_is_kept_for_the_record() -> None:
    refused = tools.bind("plan", {"title": 5})
    assert isinstance(refused, Refusal)
    assert refused.arguments == {"title": 5}
    sent = _plan()
    bound = tools.bind("plan", json.dumps(sent))
    assert not isinstance(bound, Refusal)
    assert bound.arguments == sent


def test_a_registry_holds_each_name_once_and_handlers_declare_their_model() -> None:
    again = Registry[Desk, dict[str, Any]](tools)
    assert again.names == {"plan", "refuse"}
    with pytest.raises(ValueError, match="two tools are called 'plan'"):
        Registry[Desk, dict[str, Any]](tools, again)

    async def untyped(desk: Desk, args: dict[str, Any]) -> dict[str, Any]:
        return args

    with pytest.raises(TypeError, match="pydantic model"):
        tools.tool("untyped", "No model.")(untyped)  # type: ignore[type-var]
