"""The repositories each device reports: checked, stored, read back.

The only writer of ``device_repositories`` (and, through :mod:`.devices`, of
``devices.repositories_*``). A device
reports the git clones under its allowed roots (``RepositoryReport``) after its Hello and
whenever they change; each report replaces the device's previous rows, and is stored for
the device whose stream it came on, never for one it names. A daemon older than the report
never sends one: its device has no rows and ``repositories_reported_at`` stays NULL.

The device is not trusted with the size or the shape of what it sends: at most
:data:`MAX_REPOSITORIES` are kept, each field within its cap, and an entry that is not a
clone as the protocol describes it (an absolute path, one line of printable text) is
dropped, counted, and named once in the log, never ending the stream over it.

Which repository a clone is: the last two segments of its remote, ``owner/name`` in lower
case (:func:`owner_name`). The host is kept for people to read but not compared: the same
GitHub repository is reached through SSH aliases (``github-work:acme/app``), GitHub
Enterprise hosts and test git servers, and a device can only attract the work of people
already allowed to use it (``gateway.authorization``), whatever it claims to have.
"""

from __future__ import annotations

import logging
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from controlplane.db.pool import Db, transaction
from controlplane.gateway import devices as registry
from superagent_shared.messages import Harness, Repository, RepositoryReport

log = logging.getLogger(__name__)

# A developer's machine holds tens of clones, a build box a few hundred; past this the
# report is cut (and marked truncated), so a device cannot fill the table.
MAX_REPOSITORIES = 1000
MAX_PATH = 4096  # PATH_MAX on Linux
MAX_REMOTE = 500
MAX_BRANCH = 255  # git's own limit for a ref name's component is about this
MAX_HARNESSES = 20
MAX_VERSION = 100
# A harness's name as the device's table spells it ("qwen", "claude", "codex").
HARNESS_NAME = re.compile(r"[a-z][a-z0-9_-]{0,29}")
# A segment of owner/name as GitHub and most git hosts allow it.
_SEGMENT = re.compile(r"[a-z0-9_.-]+")


@dataclass(frozen=True)
class Clone:
    """One reported clone, as stored."""

    path: str
    remote: str | None
    owner_name: str | None
    default_branch: str | None


@dataclass(frozen=True)
class Checked:
    """A report as it will be stored, and what was left out of it."""

    clones: tuple[Clone, ...]
    truncated: bool  # the device's scan stopped at its bounds, or we cut the report
    cut: bool  # we did: it had more than MAX_REPOSITORIES
    dropped: int  # malformed entries left out
    first_problem: str | None  # why the first of them was


@dataclass(frozen=True)
class StoredRepository:
    """A clone as ``superagent devices show`` and the console list it."""

    path: str
    remote: str | None
    owner_name: str | None
    default_branch: str | None
    reported_at: datetime


def owner_name(remote: str) -> str | None:
    """``owner/name`` (lower case) of a remote such as ``github.com/Acme/App``; None when it
    names no repository that way. Lenient with forms a device should have normalised
    already (a scheme, ``user@``, ``host:owner/name``, ``.git``, a trailing slash)."""
    value = remote.strip().lower()
    value = value.split("://", 1)[-1].rstrip("/")
    value = value.removesuffix(".git")
    segments = value.replace(":", "/").split("/")
    if len(segments) < 2:
        return None
    owner, name = segments[-2], segments[-1]
    for segment in (owner, name):
        if not _SEGMENT.fullmatch(segment) or segment in (".", ".."):
            return None
    return f"{owner}/{name}"


def _problem(item: Repository) -> str | None:
    """Why ``item`` is not a clone as the protocol describes one, or None."""
    if not item.path or not posixpath.isabs(item.path):
        return "the path is not absolute"
    if len(item.path) > MAX_PATH:
        return f"the path is over {MAX_PATH} characters"
    if len(item.remote) > MAX_REMOTE:
        return f"the remote is over {MAX_REMOTE} characters"
    if len(item.default_branch) > MAX_BRANCH:
        return f"the default branch is over {MAX_BRANCH} characters"
    # Shown as is in terminals and pages: printable text only (no NUL, no escapes).
    if not item.path.isprintable():
        return "the path has control characters"
    for field, value in (("remote", item.remote), ("default branch", item.default_branch)):
        if not (value.isprintable() and not any(ch.isspace() for ch in value)):
            return f"the {field} is not one word of printable text"
    return None


def check(report: RepositoryReport) -> Checked:
    """What of ``report`` is stored: well-formed entries, each path once, at most
    :data:`MAX_REPOSITORIES`."""
    clones: dict[str, Clone] = {}
    dropped = 0
    first_problem: str | None = None
    cut = False
    for item in report.repositories:
        if len(clones) >= MAX_REPOSITORIES:
            cut = True
            break
        problem = _problem(item)
        if problem is None and item.path in clones:
            problem = "the path is reported twice"
        if problem is not None:
            dropped += 1
            first_problem = first_problem or problem
            continue
        clones[item.path] = Clone(
            path=item.path,
            remote=item.remote or None,
            owner_name=owner_name(item.remote) if item.remote else None,
            default_branch=item.default_branch or None,
        )
    return Checked(tuple(clones.values()), report.truncated or cut, cut, dropped, first_problem)


def checked_harnesses(report: RepositoryReport) -> tuple[list[dict[str, object]], str]:
    """The harnesses of ``report`` as stored (well-formed names, each once, versions cut to
    one printable line), and its default ('' when it names none of them)."""
    kept: dict[str, Harness] = {}
    for item in report.harnesses[:MAX_HARNESSES]:
        if HARNESS_NAME.fullmatch(item.name) and item.name not in kept:
            kept[item.name] = item
    rows: list[dict[str, object]] = [
        {
            "name": h.name,
            "version": "".join(c for c in h.version[:MAX_VERSION] if c.isprintable()),
            "allowed": bool(h.allowed),
            "logged_in": bool(h.logged_in),
        }
        for h in kept.values()
    ]
    default = report.default_harness if report.default_harness in kept else ""
    return rows, default


async def replace(db: Db, device_id: str, report: RepositoryReport) -> Checked:
    """Store ``report`` as ``device_id``'s repositories, replacing the previous ones; what
    was stored. The caller is the device's own stream: ``device_id`` is the one its
    handshake proved, never anything the report says."""
    checked = check(report)
    if checked.dropped:
        log.warning(
            "device %s reported %d malformed repositories, left out (the first: %s)",
            device_id,
            checked.dropped,
            checked.first_problem,
        )
    if checked.cut:
        log.warning(
            "device %s reported %d repositories; kept %d",
            device_id,
            len(report.repositories),
            MAX_REPOSITORIES,
        )
    clones = checked.clones
    async with transaction(db) as conn:
        await conn.execute("DELETE FROM device_repositories WHERE device_id = $1", device_id)
        if clones:
            await conn.execute(
                "INSERT INTO device_repositories "
                "(device_id, path, remote, owner_name, default_branch) "
                "SELECT $1, * FROM unnest($2::text[], $3::text[], $4::text[], $5::text[])",
                device_id,
                [c.path for c in clones],
                [c.remote for c in clones],
                [c.owner_name for c in clones],
                [c.default_branch for c in clones],
            )
        harnesses, default = checked_harnesses(report)
        await registry.reported(conn, device_id, checked.truncated, harnesses, default)
    return checked


async def harnesses_of(db: Db, device_id: str | None) -> tuple[list[dict[str, Any]], str]:
    """The harnesses ``device_id`` last reported (installed; ``allowed`` by its policy or
    not; none from a daemon older than harnesses), and its policy's default ('' none)."""
    if device_id is None:
        return [], ""
    row = await db.fetchrow(
        "SELECT harnesses, default_harness FROM devices WHERE id = $1", device_id
    )
    if row is None:
        return [], ""
    return list(row["harnesses"] or []), row["default_harness"] or ""


def harnesses_shown(reported: list[dict[str, Any]], default: str) -> str:
    """One line for people: ``qwen 0.24.4 (allowed, default), claude 2.1 (not allowed)``."""
    if not reported:
        return "none reported"
    shown = []
    for item in reported:
        notes = ["allowed" if item.get("allowed") else "not allowed"]
        if not item.get("logged_in"):
            notes.append("not logged in")
        if item.get("name") == default:
            notes.append("default")
        shown.append(f"{item.get('name')} {item.get('version') or '?'} ({', '.join(notes)})")
    return ", ".join(shown)


async def of_device(db: Db, device_id: str) -> list[StoredRepository]:
    """The repositories ``device_id`` last reported, by path."""
    rows = await db.fetch(
        "SELECT path, remote, owner_name, default_branch, reported_at FROM device_repositories "
        "WHERE device_id = $1 ORDER BY path",
        device_id,
    )
    return [StoredRepository(**dict(row)) for row in rows]


async def of_devices(db: Db, device_ids: Sequence[str]) -> dict[str, list[StoredRepository]]:
    """The repositories of each of ``device_ids`` (those with none are left out)."""
    found: dict[str, list[StoredRepository]] = {}
    rows = await db.fetch(
        "SELECT device_id, path, remote, owner_name, default_branch, reported_at "
        "FROM device_repositories WHERE device_id = ANY($1::text[]) ORDER BY device_id, path",
        list(device_ids),
    )
    for row in rows:
        fields = dict(row)
        found.setdefault(fields.pop("device_id"), []).append(StoredRepository(**fields))
    return found


async def clones_of(db: Db, repo: str) -> dict[str, list[str]]:
    """For ``repo`` (``owner/name``, any case): the active devices reporting a clone of it,
    each with the clones' paths (shortest first)."""
    wanted = owner_name(repo)
    if wanted is None:
        return {}
    rows = await db.fetch(
        "SELECT r.device_id, r.path FROM device_repositories r "
        "JOIN devices d ON d.id = r.device_id "
        "WHERE r.owner_name = $1 AND d.revoked_at IS NULL "
        "ORDER BY r.device_id, length(r.path), r.path",
        wanted,
    )
    found: dict[str, list[str]] = {}
    for row in rows:
        found.setdefault(row["device_id"], []).append(row["path"])
    return found
