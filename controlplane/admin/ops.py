"""Operations: named, with a parameter model, run for a caller, answering JSON.

An operation is declared once (:func:`operation`) and run by :func:`perform`, which
validates its parameters (a bad one is a 400 naming the field, never a 500) and turns its
answer into plain JSON values the same way on both paths, so that a command renders the
same data whether it ran here or on a deployment.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import asyncpg
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import to_jsonable_python

from controlplane.errors import InvalidInput, NotFound
from controlplane.settings import Settings


class Params(BaseModel):
    """An operation's parameters: unknown ones are refused (a typo is not ignored)."""

    model_config = ConfigDict(extra="forbid")


P = TypeVar("P", bound=Params)


@dataclass(frozen=True)
class Caller:
    """Who runs an operation, and with what: ``by`` is recorded as who acted."""

    pool: asyncpg.Pool
    settings: Settings
    by: str
    # On the database itself (the CLI with its credentials), where a name the caller gives
    # (--author) is as good as any: whoever holds the database can write any row. Over
    # HTTP, who acts is the token's holder, whatever the request says.
    local: bool = False


@dataclass(frozen=True)
class Operation(Generic[P]):
    name: str
    params: type[P]
    run: Callable[[Caller, P], Awaitable[Any]]


REGISTRY: dict[str, Operation[Any]] = {}


def operation(
    name: str, params: type[P]
) -> Callable[[Callable[[Caller, P], Awaitable[Any]]], Callable[[Caller, P], Awaitable[Any]]]:
    """Declare ``name``, run with ``params``; a name is declared once."""

    def register(
        run: Callable[[Caller, P], Awaitable[Any]],
    ) -> Callable[[Caller, P], Awaitable[Any]]:
        if name in REGISTRY:
            raise RuntimeError(f"operation {name} is declared twice")
        REGISTRY[name] = Operation(name, params, run)
        return run

    return register


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON values: datetimes as ISO text, decimals as text, dataclasses
    and records as objects (what the HTTP answer carries)."""
    if isinstance(value, asyncpg.Record):
        value = dict(value)
    return to_jsonable_python(value, fallback=_fallback)


def _fallback(value: Any) -> Any:
    if isinstance(value, asyncpg.Record):
        return dict(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


async def perform(name: str, raw: dict[str, Any], caller: Caller) -> Any:
    """Run operation ``name`` with the parameters ``raw``; its answer as JSON values."""
    from controlplane.admin import catalog  # noqa: F401 - registers every operation

    found = REGISTRY.get(name)
    if found is None:
        raise NotFound(f"no operation {name!r}")
    try:
        params = found.params.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'parameters'}: {e['msg']}"
            for e in exc.errors()
        )
        raise InvalidInput(f"{name}: {problems}") from None
    return jsonable(await found.run(caller, params))
