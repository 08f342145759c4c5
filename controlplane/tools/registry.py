"""A toolbox's tools: each one's name, description, argument model and handler together.

``@registry.tool(name, description)`` on an async handler ``(context, args)`` registers
it; the argument model is the annotation of ``args`` (a pydantic model), and the schema
the model is shown is generated from it (:mod:`controlplane.tools.schema`).
:meth:`Registry.bind` turns a call as the model made it (a JSON string or a dict) into
validated arguments, or into a :class:`Refusal` whose one sentence says what to correct;
:meth:`Bound.run` runs the handler, whose :class:`Refused` becomes a refusal too. Neither
raises for the model's mistakes. What a handler runs with (``context``) and returns is
each toolbox's own.
"""

from __future__ import annotations

import inspect
import json
import typing
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from controlplane.tools.problems import sentence
from controlplane.tools.schema import function_spec

__all__ = ["Bound", "Refusal", "Refused", "Registry", "Tool"]

C = TypeVar("C")  # what a handler runs with: its toolbox's state for one call
R = TypeVar("R")  # what a handler returns
M = TypeVar("M", bound=BaseModel)


class Refused(Exception):
    """A tool call the rules do not allow; the message goes back to the model."""


@dataclass(frozen=True)
class Refusal:
    """A call that did not run, and why, in one sentence for the model."""

    error: str
    arguments: dict[str, Any]  # what the model sent, as far as it was a JSON object


@dataclass(frozen=True)
class Tool(Generic[C, R]):
    name: str
    description: str
    model: type[BaseModel]
    handler: Callable[[C, Any], Awaitable[R]]
    spec: dict[str, Any]  # the OpenAI function schema, strict


@dataclass(frozen=True)
class Bound(Generic[C, R]):
    """A call whose arguments fit its tool, ready to run."""

    tool: Tool[C, R]
    arguments: dict[str, Any]  # as the model sent them: for the record, and authority checks
    args: BaseModel  # validated: what the handler gets

    async def run(self, context: C) -> R | Refusal:
        try:
            return await self.tool.handler(context, self.args)
        except Refused as refused:
            return Refusal(str(refused), self.arguments)


class Registry(Generic[C, R]):
    """Tools by name, in the order they were registered (the order the model sees)."""

    def __init__(self, *families: Registry[C, R]) -> None:
        self._tools: dict[str, Tool[C, R]] = {}
        for family in families:
            for tool in family:
                self._add(tool)

    def tool(
        self, name: str, description: str
    ) -> Callable[[Callable[[C, M], Awaitable[R]]], Callable[[C, M], Awaitable[R]]]:
        """Register the decorated handler as the tool ``name``."""

        def register(handler: Callable[[C, M], Awaitable[R]]) -> Callable[[C, M], Awaitable[R]]:
            model = _argument_model(handler)
            spec = function_spec(name, description, model)
            self._add(Tool(name, description, model, handler, spec))
            return handler

        return register

    def _add(self, tool: Tool[C, R]) -> None:
        if tool.name in self._tools:
            raise ValueError(f"two tools are called {tool.name!r}")
        self._tools[tool.name] = tool

    def __iter__(self) -> Iterator[Tool[C, R]]:
        return iter(self._tools.values())

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self._tools)

    def specs(self) -> list[dict[str, Any]]:
        """Every tool's schema, as the model is shown them."""
        return [tool.spec for tool in self._tools.values()]

    def bind(self, name: str, raw: str | Mapping[str, Any] | None) -> Bound[C, R] | Refusal:
        """The call ``name(raw)`` with its arguments checked, or why it cannot run."""
        if isinstance(raw, Mapping):
            parsed: Any = dict(raw)
        else:
            try:
                parsed = json.loads(raw or "{}")
            except json.JSONDecodeError as exc:
                return Refusal(f"arguments are not valid JSON: {exc.msg}", {})
        if not isinstance(parsed, dict):
            return Refusal("arguments must be a JSON object", {})
        tool = self._tools.get(name)
        if tool is None:
            known = ", ".join(sorted(self._tools))
            return Refusal(f"no tool {name!r}; the tools are {known}", parsed)
        try:
            args = tool.model.model_validate(parsed)
        except ValidationError as invalid:
            # Said against the schema the model was shown: it can correct its call.
            return Refusal(sentence(invalid, tool.spec["function"]["parameters"]), parsed)
        return Bound(tool, parsed, args)

    async def dispatch(
        self, context: C, name: str, raw: str | Mapping[str, Any] | None
    ) -> R | Refusal:
        """Check and run one call: the handler's answer, or a refusal the model can read."""
        bound = self.bind(name, raw)
        if isinstance(bound, Refusal):
            return bound
        return await bound.run(context)


def _argument_model(handler: Callable[..., Any]) -> type[BaseModel]:
    """The pydantic model a handler's second parameter (its arguments) is annotated with."""
    parameters = list(inspect.signature(handler).parameters)
    hints = typing.get_type_hints(handler)
    model = hints.get(parameters[1]) if len(parameters) == 2 else None
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise TypeError(
            f"{handler.__qualname__} must take (context, args: <a pydantic model>), "
            "the model being the tool's arguments"
        )
    return model
