"""What a worker can ask a device to do, and how the control plane stores it.

The commands themselves are the device protocol's, defined once for both programs in
:mod:`superagent_shared.messages` (``Exec``, ``ReadFile``, …; :data:`Spec` is their
union): this module checks one before it is queued (:func:`validate`) and is the one codec
of ``commands.spec``, the JSON a command is stored as until it is delivered
(:func:`to_json`, :func:`from_json`). That JSON is field for field the dataclass, with
bytes in base64 and enums by their lower-case names ("env", "pull_request"), so rows
written by earlier releases read back unchanged. Credentials appear by name only; their
values never leave the device.
"""

from __future__ import annotations

import base64
import enum
import typing
from dataclasses import dataclass, fields
from typing import Any, Literal

from controlplane.errors import InvalidInput
from superagent_shared.messages import (
    Cancel,
    CredentialRef,
    Delivery,
    Exec,
    Glob,
    ListDir,
    Op,
    PrepareWorkspace,
    ReadFile,
    ReleaseWorkspace,
    RunHarness,
    Search,
    WorkspaceBase,
    WriteFile,
)

__all__ = [
    "KINDS",
    "Cancel",
    "CredentialRef",
    "DeliveryName",
    "Exec",
    "Glob",
    "ListDir",
    "PrepareWorkspace",
    "ReadFile",
    "ReleaseWorkspace",
    "RunHarness",
    "Search",
    "Spec",
    "WorkspaceBaseName",
    "WriteFile",
    "credential",
    "from_json",
    "to_json",
    "validate",
    "workspace_base",
]

Spec = Op

# How the device hands a credential to a command, by the names a worker's tools and the
# stored JSON use: env (the value in ``env_var``), file (a 0600 file whose path is in
# ``env_var``), git_helper (git asks the device for it; ``env_var`` is the optional git
# username), http (the device's proxy adds it to HTTPS requests for the credential's hosts:
# the value never reaches the command; ``env_var`` is unused).
DeliveryName = Literal["env", "file", "git_helper", "http"]
_DELIVERIES = (Delivery.ENV, Delivery.FILE, Delivery.GIT_HELPER, Delivery.HTTP)

# Where a ticket's workspace starts: the freshly fetched default branch, an existing pull
# request's head (``ref``), or a snapshot of the user's uncommitted changes.
WorkspaceBaseName = Literal["default_branch", "pull_request", "local_changes"]
_WORKSPACE_BASES = (
    WorkspaceBase.DEFAULT_BRANCH,
    WorkspaceBase.PULL_REQUEST,
    WorkspaceBase.LOCAL_CHANGES,
)

# Each command kind's class, by the name ``commands.kind`` stores: every kind of the protocol.
KINDS: dict[str, type[Spec]] = {c.KIND: c for c in typing.get_args(Op)}

# What an absent key meant when each kind was stored with fewer fields than today.
_STORED_DEFAULTS: dict[str, dict[str, Any]] = {
    ListDir.KIND: {"depth": 1},
    PrepareWorkspace.KIND: {"setup": True},
}


def _name(value: enum.IntEnum | int) -> str:
    return value.name.lower() if isinstance(value, enum.IntEnum) else str(value)


def credential(name: str, delivery: DeliveryName | str, env_var: str = "") -> CredentialRef:
    """A credential reference as a worker names its delivery ("env", "git_helper", …)."""
    try:
        how = Delivery[delivery.upper()]
    except KeyError:
        raise InvalidInput(f"credential {name!r}: unknown delivery {delivery!r}") from None
    return CredentialRef(name, how, env_var)


def workspace_base(name: WorkspaceBaseName | str) -> WorkspaceBase:
    """A workspace base by its name ("pull_request")."""
    try:
        return WorkspaceBase[name.upper()]
    except KeyError:
        raise InvalidInput(f"prepare_workspace: unknown base {name!r}") from None


def validate(spec: Spec) -> None:
    if isinstance(spec, Exec):
        if not spec.argv or not all(isinstance(a, str) for a in spec.argv):
            raise InvalidInput("exec needs a non-empty argv of strings")
        for use in spec.credentials:
            if use.delivery not in _DELIVERIES:
                raise InvalidInput(
                    f"credential {use.name!r}: unknown delivery {_name(use.delivery)!r}"
                )
            if use.delivery in (Delivery.ENV, Delivery.FILE) and not use.env_var:
                raise InvalidInput(
                    f"credential {use.name!r} needs env_var for {_name(use.delivery)}"
                )
    elif isinstance(spec, ReadFile | WriteFile | ListDir):
        if not spec.path:
            raise InvalidInput(f"{spec.KIND} needs a path")
    elif isinstance(spec, Cancel) and not spec.target_command_id:
        raise InvalidInput("cancel needs a target command id")
    elif isinstance(spec, PrepareWorkspace):
        if not spec.ticket_id or not (spec.repo or spec.path):
            raise InvalidInput("prepare_workspace needs a ticket and a repository or path")
        if spec.base not in _WORKSPACE_BASES:
            raise InvalidInput(f"prepare_workspace: unknown base {_name(spec.base)!r}")
        if spec.base == WorkspaceBase.PULL_REQUEST and not spec.ref:
            raise InvalidInput("prepare_workspace on a pull request needs its head branch (ref)")
    elif isinstance(spec, ReleaseWorkspace) and not spec.ticket_id:
        raise InvalidInput("release_workspace needs a ticket")
    elif isinstance(spec, Search | Glob) and not (spec.pattern and spec.path):
        raise InvalidInput(f"{spec.KIND} needs a pattern and a path")
    elif isinstance(spec, RunHarness) and not (spec.harness and spec.cwd and spec.prompt):
        raise InvalidInput("run_harness needs a harness, a working directory and a prompt")


# ---------------------------------------------------------------------------- JSON


def _encode(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, enum.IntEnum):
        return value.name.lower()
    if isinstance(value, tuple | list):
        return [_encode(v) for v in value]
    if isinstance(value, CredentialRef):
        return {f.name: _encode(getattr(value, f.name)) for f in fields(value)}
    return value  # str, int, bool, None, the env dict


def to_json(spec: Spec) -> dict[str, Any]:
    """``spec`` as ``commands.spec`` stores it: its fields, in their order."""
    return {f.name: _encode(getattr(spec, f.name)) for f in fields(spec)}


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    decode: Any  # the JSON value to the field's


_DECODERS: dict[type[Any], tuple[_Field, ...]] = {}


def _decoders(cls: type[Spec]) -> tuple[_Field, ...]:
    """How each of ``cls``'s stored fields reads back, from its annotation."""
    found = _DECODERS.get(cls)
    if found is not None:
        return found
    hints = typing.get_type_hints(cls)
    found = _DECODERS[cls] = tuple(_Field(f.name, _decoder(hints[f.name])) for f in fields(cls))
    return found


def _decoder(hint: Any) -> Any:
    args = set(typing.get_args(hint)) or {hint}
    if bytes in args:
        return lambda v: None if v is None else base64.b64decode(v)
    for arg in args:
        if isinstance(arg, type) and issubclass(arg, enum.IntEnum):
            kind = arg
            return lambda v: kind[v.upper()]
    if CredentialRef in args:  # Sequence[CredentialRef]
        return lambda v: tuple(
            CredentialRef(c["name"], Delivery[c["delivery"].upper()], c.get("env_var", ""))
            for c in v
        )
    return lambda v: v


def from_json(kind: str, data: dict[str, Any]) -> Spec:
    """The spec stored as ``data`` (:func:`to_json`) for a command of ``kind``."""
    cls = KINDS.get(kind)
    if cls is None:
        raise InvalidInput(f"unknown command kind {kind!r}")
    stored = {**_STORED_DEFAULTS.get(kind, {}), **data}
    return cls(**{f.name: f.decode(stored[f.name]) for f in _decoders(cls) if f.name in stored})
