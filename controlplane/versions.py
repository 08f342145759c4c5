"""Immutable, versioned documents (prompts and policies): every save is a new version.

A save names the version it was based on. If another save landed since, it is refused with
a Conflict naming both, so two people editing at once never silently overwrite each other.
"""

from __future__ import annotations

from typing import Any, TypeVar

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.db.models import PolicyVersion, PromptVersion
from controlplane.errors import Conflict, NotFound

Version = TypeVar("Version", PolicyVersion, PromptVersion)


async def latest(session: AsyncSession, model: type[Version], name: str) -> Version | None:
    return (
        await session.scalars(
            select(model).where(model.name == name).order_by(model.version.desc()).limit(1)
        )
    ).first()


async def get(session: AsyncSession, model: type[Version], version_id: str) -> Version:
    row = await session.get(model, version_id)
    if row is None:
        raise NotFound(f"no version {version_id!r}")
    return row


async def save(
    session: AsyncSession,
    model: type[Version],
    *,
    name: str,
    body: Any,
    base_id: str | None,
    author: str,
) -> Version:
    """A new version of ``name`` on top of ``base_id`` (None only for the first version)."""
    current = await latest(session, model, name)
    if current is None and base_id is not None:
        raise Conflict(f"{name} has no versions yet; save the first one without a base")
    if current is not None and base_id != current.id:
        based_on = "no base version" if base_id is None else f"version {base_id}"
        raise Conflict(
            f"{name} has changed: the latest is version {current.version} ({current.id}), "
            f"this edit was based on {based_on}; reload it and apply the edit again"
        )
    row = model(
        name=name,
        version=1 if current is None else current.version + 1,
        base_id=base_id,
        body=body,
        author=author,
    )
    session.add(row)
    try:
        # A concurrent save on the same base takes the same version number; the unique
        # (name, version) lets exactly one of them through.
        async with session.begin_nested():
            await session.flush()
    except IntegrityError:
        raise Conflict(
            f"{name} has changed: another edit was saved on the same base; reload it"
        ) from None
    return row
