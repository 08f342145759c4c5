"""The versioned documents (``superagent admission`` and ``prompts``): one version shown,
and a new one saved on top of the one it was based on.

Saving validates the text, and resolves a policy's handles to ids with the deployment's
own channel credentials (:mod:`controlplane.handles`), before the version is written: over
HTTP, that happens on the deployment, and the author is the caller (the token's holder).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field

from controlplane import handles, prompts, versions
from controlplane.admin.ops import Caller, Params, operation
from controlplane.errors import InvalidInput
from controlplane.ingest import admission

KINDS = {"policy": versions.POLICY, "prompt": versions.PROMPT}
_Kind = Literal["policy", "prompt"]


def policy_text(body: Any) -> str:
    return json.dumps(body, indent=2, sort_keys=False) + "\n"


def default_text(kind: _Kind, name: str) -> str:
    if kind == "policy":
        return policy_text(admission.Admission().model_dump(mode="json"))
    return prompts.DEFAULTS[name] + "\n"


def body_of(kind: _Kind, text: str) -> Any:
    """The version's body from its text; InvalidInput says what is wrong with it."""
    if kind == "prompt":
        if not text.strip():
            raise InvalidInput("a prompt cannot be empty")
        return text.rstrip("\n")
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"not valid JSON: {exc.msg} at line {exc.lineno}") from None
    # Validated, then stored as written out by the model: defaults filled in, so every
    # version is complete on its own.
    return admission.parse(body).model_dump(mode="json")


def _named(kind: _Kind, name: str) -> str:
    if kind == "policy":
        if name != admission.POLICY_NAME:
            raise InvalidInput(f"the policy is named {admission.POLICY_NAME!r}")
    elif name not in prompts.DEFAULTS:
        raise InvalidInput(f"no prompt {name!r} (prompts: {', '.join(sorted(prompts.DEFAULTS))})")
    return name


class Show(Params):
    kind: _Kind
    name: Annotated[str, Field(max_length=100)]
    version: Annotated[str | None, Field(max_length=100)] = None


@operation("versions.show", Show)
async def show(caller: Caller, params: Show) -> dict[str, Any]:
    """A version (the latest, or ``version``), or the built-in default when none is saved."""
    kind, name = KINDS[params.kind], _named(params.kind, params.name)
    row: versions.Version | None
    if params.version is not None:
        row = await versions.get(caller.pool, kind, params.version)
        if row.name != name:
            raise InvalidInput(f"{params.version} is a version of {row.name}, not of {name}")
    else:
        row = await versions.latest(caller.pool, kind, name)
    if row is None:
        return {
            "id": None,
            "version": None,
            "author": None,
            "created_at": None,
            "text": default_text(params.kind, name),
        }
    text = policy_text(row.body) if params.kind == "policy" else row.body + "\n"
    return {
        "id": row.id,
        "version": row.version,
        "author": row.author,
        "created_at": row.created_at,
        "text": text,
    }


class Save(Params):
    kind: _Kind
    name: Annotated[str, Field(max_length=100)]
    text: Annotated[str, Field(max_length=1_000_000)]
    base: Annotated[str | None, Field(max_length=100)] = None
    author: Annotated[str | None, Field(max_length=200)] = None  # on the database only


@operation("versions.save", Save)
async def save(caller: Caller, params: Save) -> dict[str, Any]:
    """A new version from ``text``, based on ``base``; refused if another was saved since."""
    kind, name = KINDS[params.kind], _named(params.kind, params.name)
    body = body_of(params.kind, params.text)
    notes: list[str] = []
    if params.kind == "policy":
        async with handles.Resolver(caller.settings, caller.pool) as resolver:
            body, notes = await resolver.policy(body)
    # Over HTTP the author is who the token says; on the database, who the CLI says.
    author = params.author if params.author and caller.local else caller.by
    saved = await versions.save(
        caller.pool, kind, name=name, body=body, base_id=params.base, author=author
    )
    return {
        "saved": True,
        "name": name,
        "id": saved.id,
        "version": saved.version,
        "base": params.base,
        "author": author,
        "resolved": notes,
    }
