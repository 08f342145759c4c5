"""One device, and whom it is shared with (``superagent devices show|share|unshare``)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

from pydantic import Field

from controlplane.admin.ops import Caller, Params, operation
from controlplane.gateway import authorization as access
from controlplane.gateway import devices as registry
from controlplane.gateway import repositories

_NAME = Annotated[str, Field(max_length=1000)]


class One(Params):
    device: _NAME


@operation("devices.show", One)
async def show(caller: Caller, params: One) -> dict[str, Any]:
    """The device's view, the repositories it reports, and its harnesses."""
    view = await registry.find(caller.pool, params.device)
    clones = await repositories.of_device(caller.pool, view.id)
    harnesses, default = await repositories.harnesses_of(caller.pool, view.id)
    return asdict(view) | {
        "repositories": [asdict(clone) for clone in clones],
        "harnesses": harnesses,
        "default_harness": default or None,
    }


class Shares(Params):
    device: _NAME
    grantees: Annotated[list[Annotated[str, Field(max_length=300)]], Field(min_length=1)]


def _shares(found: access.Device) -> dict[str, Any]:
    return {"id": found.id, "name": found.name, "owner": found.owner, "shares": found.shares}


@operation("devices.share", Shares)
async def share(caller: Caller, params: Shares) -> dict[str, Any]:
    """Let each grantee direct work to the device, on its owner's behalf (by: the caller)."""
    found = await access.device(caller.pool, params.device)
    for grantee in params.grantees:
        found = await access.share(caller.pool, found.id, grantee, by=caller.by)
    return _shares(found)


@operation("devices.unshare", Shares)
async def unshare(caller: Caller, params: Shares) -> dict[str, Any]:
    """Take each grantee's share back."""
    found = await access.device(caller.pool, params.device)
    for grantee in params.grantees:
        found = await access.unshare(caller.pool, found.id, grantee)
    return _shares(found)
