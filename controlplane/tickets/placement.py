"""Which device a ticket goes to: the one its request names (:func:`named`), or, for a
known repository, one chosen in code (docs/architecture.md, *Workers*, workspaces), never
guessed by the model.

A request may name a device by name or id, or as "my laptop": one its requester owns
(owned by their person, ``superagent users link``, or by their account, never matched by
a display name or a handle). Of several that fit, the one with a clone of the request's
repository, when exactly one has it.

A request that names a repository (``repo`` in create_ticket, or the GitHub thread's own
``owner/name``) and no device is placed on a device that reports a clone of it
(:mod:`controlplane.gateway.repositories`) and that the requester may use
(:mod:`controlplane.gateway.authorization`: their own, or shared with them). A device they
may use only with its owner's approval is never picked on its own: it is named, so they
can ask for it by name.

In order:

1. The requester's own devices that have it: the one online. Two online: ask which.
2. None of their own online (the policy's ``routing.offline_owner_device``):
   ``shared``: an online device shared with them that has it (two: ask), else wait for
   their own; ``ask``: ask them, naming every candidate; ``wait``: wait for their own.
   Waiting is the ordinary offline case: the ticket is placed there and waits in
   ``waiting_device`` until it reconnects. Two offline devices of their own: ask.
3. No device of their own has it: a device shared with them, the online one first; two
   equally good (both online, or both offline): ask.

The ticket's ``workdir`` becomes the chosen device's clone of the repository (the shortest
path when it has several: each ticket works in its own worktree made from it, so any clone
serves). What the requester is asked comes back as :class:`AskWhich`, for the router to
put to them; nothing is created until they answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from controlplane.db.pool import Conn, Db
from controlplane.errors import NotFound
from controlplane.gateway import authorization as access
from controlplane.gateway import devices as registry
from controlplane.gateway import repositories
from controlplane.ingest.admission import OfflineOwnerDevice

_USABLE = ("owner", "delegated", "shared")  # the rules that need nobody's approval


@dataclass(frozen=True)
class Candidate:
    """A device that reports a clone of the repository, and what lets the requester in."""

    device: access.Device
    rule: str  # owner, delegated, shared; pending: only with its owner's approval
    online: bool
    clones: tuple[str, ...]  # its clones' paths, shortest first

    @property
    def own(self) -> bool:
        return self.rule == "owner"

    def describe(self) -> str:
        """For the router's model: the device, whose it is to the requester, whether online."""
        whose = (
            "the requester's own"
            if self.own
            else f"{self.device.owner}'s, shared with the requester"
            if self.rule in _USABLE
            else f"{self.device.owner}'s, not shared with the requester"
        )
        return f"{self.device.name} ({whose}, {'online' if self.online else 'offline'})"


@dataclass(frozen=True)
class Placed:
    """The device chosen, its clone of the repository, and why, in one line."""

    device_id: str
    workdir: str
    why: str


@dataclass(frozen=True)
class Unplaced:
    """No device the requester may use reports the repository; ``others``: devices that
    do, usable only with their owners' approval (named, never picked)."""

    why: str
    others: tuple[str, ...]


class NotNamed(Exception):
    """The device a request names is not a paired one, or "my …" fits none or several of
    the requester's; the message says what to name instead."""


class AskWhich(Exception):
    """The choice is the requester's: two equally good devices, or an offline device of
    their own and the policy says to ask. The message names the candidates."""

    def __init__(self, repo: str, why: str, candidates: Sequence[Candidate]) -> None:
        names = "; ".join(c.describe() for c in candidates)
        super().__init__(
            f"which device should work on {repo} is the requester's choice ({why}): "
            f"{names}. Ask them, then call create_ticket with the device they name"
        )
        self.candidates = tuple(candidates)


async def named(conn: Conn, device: str | None, trigger_id: str, *, repo: str | None) -> str | None:
    """A device by name or id; "my laptop" (any "my …") is one the trigger's sender owns."""
    if device is None:
        return None
    found = await conn.fetchval(
        "SELECT id FROM devices WHERE (id = $1 OR name = $1) AND revoked_at IS NULL",
        device,
    )
    if found is not None:
        return str(found)
    words = device.strip().casefold().split()
    if words[0] not in ("my", "mine"):
        raise NotNamed(f"no paired device {device!r}")
    requester = await access.requester_of_trigger(conn, trigger_id)
    owned = await access.owned(conn, requester)
    who = requester.name
    if not owned:
        raise NotNamed(
            f"{who} owns no paired device (pair one with `superagent devices pair --name "
            f"NAME --owner {requester.handle}`, or link their accounts to the person who "
            "owns one with `superagent users link`)"
        )
    kind = words[1:]  # "my laptop" → prefer a device called or labelled laptop
    fitting = [d for d in owned if not kind or any(k in d[1] for k in kind)]
    if len(fitting) == 1:
        return fitting[0][0]
    if len(owned) == 1:
        return owned[0][0]
    if repo is not None:
        clones = await repositories.clones_of(conn, repo)
        having = [d for d in (fitting or owned) if d[0] in clones]
        if len(having) == 1:
            return having[0][0]
    names = ", ".join(name for _, name in owned)
    raise NotNamed(f"{who} owns several devices ({names}); name one of them")


async def clone_on(db: Db, repo: str, device_id: str) -> str | None:
    """The named device's own clone of ``repo``, if it reported one."""
    clones = (await repositories.clones_of(db, repo)).get(device_id)
    return clones[0] if clones else None


def thread_repo(source: str | None, external_id: str | None) -> str | None:
    """A GitHub thread's own repository (``owner/name#N`` → ``owner/name``)."""
    if source == "github" and external_id and "#" in external_id:
        return external_id.split("#", 1)[0]
    return None


async def candidates(db: Db, repo: str, requester: access.Requester) -> list[Candidate]:
    """Every active device reporting a clone of ``repo``, with the requester's access."""
    clones = await repositories.clones_of(db, repo)
    live = await registry.online(db, list(clones))
    found = []
    for device_id, paths in sorted(clones.items()):
        try:
            device = await access.device(db, device_id)
        except NotFound:
            continue  # revoked since the clones were read
        rule = access.check(device, requester, by="placement")["rule"]
        found.append(Candidate(device, rule, device_id in live, tuple(paths)))
    return found


async def place(
    db: Db, repo: str, requester: access.Requester, *, offline_owner_device: OfflineOwnerDevice
) -> Placed | Unplaced:
    """The device for ``requester``'s ticket on ``repo`` (see the module's doc); AskWhich
    when the choice is theirs."""
    found = await candidates(db, repo, requester)
    usable = [c for c in found if c.rule in _USABLE]
    own = [c for c in usable if c.own]
    shared = [c for c in usable if not c.own]
    if not usable:
        others = tuple(c.describe() for c in found)
        why = f"no device the requester may use reports a clone of {repo}"
        if others:
            why += f"; {', '.join(others)} has one: naming it as the device asks its owner"
        return Unplaced(why, others)
    if own:
        chosen = _online_one(repo, own, "several of their own devices have it")
        if chosen is not None:
            return _placed(chosen, f"the requester's own, has {repo}")
        if offline_owner_device == "ask":
            raise AskWhich(
                repo,
                "their own device with it is offline, and the policy says to ask",
                own + [c for c in shared if c.online],
            )
        if offline_owner_device == "shared":
            chosen = _online_one(repo, shared, "several devices shared with them have it")
            if chosen is not None:
                return _placed(
                    chosen, f"shared with the requester, has {repo}; their own is offline"
                )
        if len(own) > 1:
            raise AskWhich(repo, "several of their own devices have it, none online", own)
        return _placed(own[0], f"the requester's own, has {repo}; offline: the ticket waits for it")
    chosen = _online_one(repo, shared, "several devices shared with them have it")
    if chosen is not None:
        return _placed(chosen, f"shared with the requester, has {repo}")
    if len(shared) > 1:
        raise AskWhich(repo, "several devices shared with them have it, none online", shared)
    return _placed(
        shared[0], f"shared with the requester, has {repo}; offline: the ticket waits for it"
    )


def _online_one(repo: str, tier: list[Candidate], why: str) -> Candidate | None:
    """The one online candidate of ``tier``; None when none is; AskWhich when several are."""
    online = [c for c in tier if c.online]
    if len(online) > 1:
        raise AskWhich(repo, why, online)
    return online[0] if online else None


def _placed(chosen: Candidate, why: str) -> Placed:
    return Placed(chosen.device.id, chosen.clones[0], f"{chosen.device.name}: {why}")
