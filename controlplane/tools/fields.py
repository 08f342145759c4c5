"""Argument models' base and the field types tools share: checked text and typed ids.

A field's checks sit on its type, beside the schema it guards: a title's length, an id's
prefix. What they say when a call fails them is written to follow the field's name
(``arguments.thread must be a thr_ id, not 'x'``).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from controlplane.tools.problems import field_problem
from superagent_shared.ids import id_prefix

__all__ = [
    "ID_CHARS",
    "NON_BLANK",
    "Arguments",
    "ThreadId",
    "TicketId",
    "TriggerId",
    "id_of",
]

ID_CHARS = 100  # longer is no id of ours, and not worth echoing back


class Arguments(BaseModel):
    """Base of every tool's arguments: JSON's types as they are (a "5" is no integer, a 1
    no boolean) and nothing the schema does not name."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


def _non_blank(value: str) -> str:
    if not value.strip():
        raise field_problem("must not be empty")
    return value


NON_BLANK = AfterValidator(_non_blank)


def id_of(*prefixes: str) -> AfterValidator:
    """A check that a string is a well-formed id with one of ``prefixes``."""
    named = [f"{prefix}_" for prefix in prefixes]
    shown = named[0] if len(named) == 1 else f"{', '.join(named[:-1])} or {named[-1]}"

    def check(value: str) -> str:
        if id_prefix(value) not in prefixes:
            raise field_problem(f"must be a {shown} id, not {value!r}")
        return value

    return AfterValidator(check)


TriggerId = Annotated[str, Field(max_length=ID_CHARS), id_of("trg")]
ThreadId = Annotated[str, Field(max_length=ID_CHARS), id_of("thr")]
TicketId = Annotated[str, Field(max_length=ID_CHARS), id_of("tkt")]
