"""People and their accounts across channels (``superagent users``)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from controlplane import handles, people
from controlplane.admin.ops import Caller, Params, operation

_ACCOUNT = Annotated[str, Field(max_length=300)]


class Link(Params):
    person: Annotated[str, Field(max_length=200)]
    accounts: Annotated[list[_ACCOUNT], Field(min_length=1, max_length=50)]


@operation("users.link", Link)
async def link(caller: Caller, params: Link) -> dict[str, Any]:
    """Link accounts (SOURCE:HANDLE, a handle looked up once by the channel's API, the id
    kept) to a person, creating the person if new."""
    refs = [people.parse_account(text) for text in params.accounts]
    async with handles.Resolver(caller.settings, caller.pool) as resolver:
        found = [await resolver.account(ref.source, ref.handle) for ref in refs]
    ids = [
        people.AccountRef(f.source, f.id, ref.handle if f.label is not None else None)
        for f, ref in zip(found, refs, strict=True)
    ]
    linked = await people.link(caller.pool, params.person, ids)
    return {
        "person": linked.name,
        "linked": [str(ref) for ref in ids],
        "shown": [f"{ref} ({ref.label})" if ref.label else str(ref) for ref in ids],
    }


class Unlink(Params):
    account: _ACCOUNT


@operation("users.unlink", Unlink)
async def unlink(caller: Caller, params: Unlink) -> dict[str, Any]:
    ref = people.parse_account(params.account)
    owner = await people.unlink(caller.pool, ref)
    return {"unlinked": str(ref), "person": owner}


class Person(Params):
    person: Annotated[str, Field(max_length=200)]


@operation("users.remove", Person)
async def remove(caller: Caller, params: Person) -> dict[str, Any]:
    await people.remove(caller.pool, params.person)
    return {"removed": params.person}


class Everyone(Params):
    pass


@operation("users.list", Everyone)
async def listing(caller: Caller, params: Everyone) -> dict[str, list[str]]:
    return await people.everyone(caller.pool)
