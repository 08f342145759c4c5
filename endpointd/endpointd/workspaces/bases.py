"""Where a new workspace starts (PrepareWorkspace.base), worked out in the user's clone
without touching their checkout, index or stashes.

* **default branch**: the remote's default branch (``refs/remotes/<remote>/HEAD``, else
  asked of the remote), fetched now into its remote-tracking ref as a plain ``git fetch``
  would, and the worktree starts at that commit. A clone without a remote starts from its
  current commit.
* **pull request**: the PR's head branch ``ref``, fetched the same way; the workspace's
  branch starts there and tracks ``<remote>/<ref>`` (so ``git status`` and ``git pull``
  follow the PR). Its commits update the PR when pushed there: ``git push <remote>
  HEAD:<ref>``.
* **local changes**: the user's uncommitted changes to tracked files, snapshotted with
  ``git stash create`` against a copy of their index (their index file is never written;
  nothing is stashed; untracked files are not included), committed as one commit on top of
  their HEAD; their HEAD itself when there is nothing uncommitted.

Fetching, checking out and snapshotting run in a git directory endpointd writes itself
(:mod:`endpointd.workspaces.shadow`), so nothing a command wrote in the clone's config or
attributes applies; the remote is named by its URL (:mod:`endpointd.workspaces.remote_url`).
A fetch first runs without a credential (ssh uses the agent). When that fails, the daemon
may try once more with ``auth`` (:class:`FetchAuth`): endpointd's own git
credential helper for a credential the owner stored for the remote's host (see
:mod:`endpointd.workspaces.operations`). git's messages reach the control plane only as a
one-line error, with any ``user:password@`` removed.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from endpointd.paths import ensure_private_dir
from endpointd.rules.remotes import default_branch, remotes
from endpointd.workspaces.errors import FetchFailed, GitError, WorkspaceError
from endpointd.workspaces.git import FETCH_TIMEOUT, git
from endpointd.workspaces.gitdirs import local_repository
from endpointd.workspaces.jail import ports_for
from endpointd.workspaces.remote_url import Transport, transport
from endpointd.workspaces.shadow import Shadow, shadow
from endpointd.workspaces.store import Record
from superagent_shared.messages import PrepareWorkspace, WorkspaceBase

__all__ = ["FetchAuth", "Start", "checkout", "start"]


@dataclass(frozen=True)
class FetchAuth:
    """How a fetch gets a stored credential: git's configuration for endpointd's helper
    (in ``GIT_CONFIG_*`` variables), and who to tell the fetch's pid (the helper answers
    that process tree only)."""

    env: Mapping[str, str]
    on_start: Callable[[int], None]


@dataclass(frozen=True)
class Start:
    kind: str  # default_branch | pull_request | local_changes
    commit: str  # the commit the workspace starts from
    commit_ish: str  # what `git worktree add` is given (a ref, to track it)
    upstream: str = ""
    track: bool = False


def start(
    record: Record,
    op: PrepareWorkspace,
    scratch: Path,
    auth: FetchAuth | None = None,
    denied_rule: Callable[[str], str | None] = lambda _: None,
) -> Start:
    """Where ``record``'s new worktree starts, for ``op``'s base. ``denied_rule``: the
    policy's, for a remote that is a local path."""
    with shadow(scratch, os.path.join(record.common_dir, "objects"), _format(record)) as sh:
        where = _Where(record, sh, scratch, auth, denied_rule)
        if op.base == WorkspaceBase.PULL_REQUEST:
            return _pull_request(where, op.ref.removeprefix("refs/heads/"))
        if op.base == WorkspaceBase.LOCAL_CHANGES:
            return _local_changes(where)
        return _default_branch(where)


@dataclass(frozen=True)
class _Where:
    record: Record
    shadow: Shadow
    scratch: Path
    auth: FetchAuth | None
    denied_rule: Callable[[str], str | None]


def _format(record: Record) -> str:
    return git("rev-parse", "--show-object-format", cwd=record.clone) or "sha1"


def _commit(ref: str, cwd: str) -> str:
    return git(
        "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", cwd=cwd, what=f"finding {ref}"
    )


def _url(where: _Where) -> tuple[str, Transport]:
    """The remote's URL as endpointd's parser reads it from the clone's config, rewritten
    only by the owner's own configuration (endpointd's environment), and its transport."""
    record = where.record
    config = ""
    with contextlib.suppress(OSError):
        config = Path(record.common_dir, "config").read_text(encoding="utf-8", errors="replace")
    configured = next((u for n, u in remotes(config) if n == record.remote), "")
    if not configured:
        raise WorkspaceError(f"the clone's remote {record.remote!r} has no url")
    if configured.startswith("-"):
        raise WorkspaceError(f"the remote {configured!r} is not a URL endpointd fetches from")
    env = where.shadow.env()
    url = git("ls-remote", "--get-url", "--", configured, cwd=where.shadow.git_dir, env=env)
    found = transport(url, where.denied_rule)
    if found.local_path:
        local_repository(found.local_path, where.denied_rule)
    return url, found


def _pair(line: str) -> tuple[str, str]:
    oid, _, name = line.partition(" ")
    return oid, name


def _remote(where: _Where, *args: str, what: str) -> str:
    """git talking to the record's remote (fetch, ls-remote) by its URL, from the shadow
    git directory: with ``auth`` when given, and :class:`FetchFailed` naming the URL when
    it fails."""
    url, found = _url(where)
    auth = where.auth
    env = where.shadow.env()
    if auth is not None:
        env.update(auth.env)
        # With a stored credential on offer, TLS is checked whatever else says otherwise.
        count = int(env.get("GIT_CONFIG_COUNT", "0"))
        env[f"GIT_CONFIG_KEY_{count}"] = "http.sslVerify"
        env[f"GIT_CONFIG_VALUE_{count}"] = "true"
        env["GIT_CONFIG_COUNT"] = str(count + 1)
    try:
        return git(
            *args[:-1],
            url,
            *args[-1:],
            cwd=where.shadow.git_dir,
            timeout=FETCH_TIMEOUT,
            env=env,
            on_start=auth.on_start if auth is not None else None,
            what=what,
            protocol=found.protocol,
            connect_ports=ports_for(url, found.protocol),
        )
    except GitError as exc:
        raise FetchFailed(str(exc), url) from None


# A branch or remote name endpointd puts in a refspec: read from files a command can write
# (the clone's config, refs/remotes/<remote>/HEAD) or sent by the control plane.
_NAME = re.compile(r"(?!-)(?!.*\.\.)(?!.*//)(?!.*@\{)[A-Za-z0-9._@+/-]{1,200}(?<![/.])\Z")


def _checked(kind: str, name: str) -> str:
    if not _NAME.match(name) or name.endswith(".lock") or name.startswith("/"):
        raise WorkspaceError(f"the {kind} name {name!r} is not one endpointd fetches")
    return name


def _fetch(where: _Where, branch: str) -> str:
    """Fetch ``branch`` of the record's remote into its remote-tracking ref; its commit."""
    record = where.record
    remote = _checked("remote", record.remote)
    branch = _checked("branch", branch)
    tracking = f"refs/remotes/{remote}/{branch}"
    # What the clone already has, offered to the remote so that only the new is sent.
    have = git(
        "for-each-ref",
        "--count=5000",
        "--format=%(objectname) %(refname)",
        "refs/heads",
        "refs/remotes",
        "refs/tags",
        cwd=record.clone,
    )
    where.shadow.set_refs(_pair(line) for line in have.splitlines())
    options = ["--quiet", "--no-tags", "--no-recurse-submodules", "--no-write-fetch-head"]
    options += ["--no-auto-maintenance"]
    _remote(
        where,
        "fetch",
        *options,
        "--",
        f"+refs/heads/{branch}:{tracking}",
        what=f"git fetch {remote} {branch}",
    )
    commit = git(
        "rev-parse",
        "--verify",
        "--quiet",
        f"{tracking}^{{commit}}",
        cwd=where.shadow.git_dir,
        env=where.shadow.env(),
        what=f"finding {tracking}",
    )
    # Into the clone's remote-tracking ref, as a plain fetch would (plumbing: no program).
    git("update-ref", "-m", f"fetch {remote} {branch}", tracking, commit, cwd=record.clone)
    return commit


def _default_branch(where: _Where) -> Start:
    record = where.record
    if not record.remote:
        head = _commit("HEAD", record.clone)
        return Start("default_branch", head, head)
    branch = _remote_head(where)
    commit = _fetch(where, branch)
    return Start("default_branch", commit, commit)


def _remote_head(where: _Where) -> str:
    """The remote's default branch: as the clone knows it, else as the remote says."""
    record = where.record
    prefix = f"refs/remotes/{record.remote}/"
    text = ""
    with contextlib.suppress(OSError):
        text = Path(record.common_dir, prefix, "HEAD").read_text(encoding="utf-8").strip()
    if text.startswith(f"ref: {prefix}"):
        return text.removeprefix(f"ref: {prefix}")
    out = _remote(
        where,
        "ls-remote",
        "--symref",
        "--",
        "HEAD",
        what=f"asking {record.remote} for its default branch",
    )
    for line in out.splitlines():
        target, _, name = line.partition("\t")
        if name == "HEAD" and target.startswith("ref: refs/heads/"):
            return target.removeprefix("ref: refs/heads/")
    # An empty remote, or one that hides its HEAD: the branch the clone has out, if any.
    local = default_branch(record.common_dir, "")
    if local:
        return local
    raise WorkspaceError(f"cannot tell the default branch of {record.remote}")


def _pull_request(where: _Where, ref: str) -> Start:
    record = where.record
    if not record.remote:
        raise WorkspaceError(f"{record.clone} has no remote to fetch the pull request from")
    commit = _fetch(where, ref)
    tracking = f"refs/remotes/{record.remote}/{ref}"
    return Start("pull_request", commit, tracking, upstream=f"{record.remote}/{ref}", track=True)


def _local_changes(where: _Where) -> Start:
    record, scratch = where.record, where.scratch
    clone = record.clone
    try:
        head = _commit("HEAD", clone)
    except GitError:
        raise WorkspaceError(f"{clone} has no commit yet: nothing to start from") from None
    index = os.path.join(clone, git("rev-parse", "--git-path", "index", cwd=clone))
    ensure_private_dir(scratch)
    copy = scratch / f"{record.ticket}.index"
    # The snapshot runs in the shadow git directory: the clone's clean filters and
    # fsmonitor (its config, its attributes file) never run.
    where.shadow.set_head(head)
    env = where.shadow.env(work_tree=clone, index=str(copy))
    try:
        if os.path.exists(index):
            shutil.copyfile(index, copy)
        stash = git(
            "stash",
            "create",
            cwd=clone,
            env=env,
            what="snapshotting the local changes (git stash create)",
        )
    finally:
        for leftover in (copy, copy.with_name(copy.name + ".lock")):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
    if not stash:
        return Start("local_changes", head, head)
    commit = git(
        "commit-tree",
        f"{stash}^{{tree}}",
        "-p",
        head,
        "-m",
        f"The local changes {record.ticket} started from",
        cwd=where.shadow.git_dir,
        env=where.shadow.env(),
        what="recording the local changes (git commit-tree)",
    )
    return Start("local_changes", commit, commit)


def checkout(scratch: Path, record: Record, commit: str) -> None:
    """Fill the new worktree ``record.path`` (made with ``--no-checkout``) with ``commit``
    and its index, from the shadow git directory: the clone's smudge filters, hooks and
    sparse settings never run."""
    objects = os.path.join(record.common_dir, "objects")
    with shadow(scratch, objects, _format(record)) as sh:
        env = sh.env(work_tree=record.path, index=os.path.join(record.admin_dir, "index"))
        git(
            "read-tree",
            "--reset",
            "-u",
            commit,
            cwd=record.path,
            env=env,
            what="checking the workspace out (git read-tree)",
        )
