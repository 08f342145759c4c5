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

Fetching uses the user's own git setup (credential helper, ssh agent). When that fails,
the daemon may try once more with ``auth`` (:class:`FetchAuth`): endpointd's own git
credential helper for a credential the owner stored for the remote's host (see
:mod:`endpointd.workspaces.operations`). git's messages reach the control plane only as a
one-line error, with any ``user:password@`` removed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from endpointd.paths import ensure_private_dir
from endpointd.rules.remotes import default_branch
from endpointd.workspaces.errors import FetchFailed, GitError, WorkspaceError
from endpointd.workspaces.git import FETCH_TIMEOUT, git
from endpointd.workspaces.store import Record
from superagent_shared.messages import PrepareWorkspace, WorkspaceBase

__all__ = ["FetchAuth", "Start", "start"]


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
    record: Record, op: PrepareWorkspace, scratch: Path, auth: FetchAuth | None = None
) -> Start:
    """Where ``record``'s new worktree starts, for ``op``'s base."""
    if op.base == WorkspaceBase.PULL_REQUEST:
        return _pull_request(record, op.ref.removeprefix("refs/heads/"), auth)
    if op.base == WorkspaceBase.LOCAL_CHANGES:
        return _local_changes(record, scratch)
    return _default_branch(record, auth)


def _commit(ref: str, cwd: str) -> str:
    return git(
        "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", cwd=cwd, what=f"finding {ref}"
    )


def _remote(record: Record, auth: FetchAuth | None, *args: str, what: str) -> str:
    """git talking to the record's remote (fetch, ls-remote): with ``auth`` when given,
    and :class:`FetchFailed` naming the remote's URL when it fails."""
    # With a stored credential on offer, the clone's config may not turn TLS checks off.
    safe = ("-c", "http.sslVerify=true") if auth is not None else ()
    try:
        return git(
            *safe,
            *args,
            cwd=record.clone,
            timeout=FETCH_TIMEOUT,
            env=auth.env if auth is not None else None,
            on_start=auth.on_start if auth is not None else None,
            what=what,
        )
    except GitError as exc:
        url = ""
        with contextlib.suppress(GitError):  # as git reaches it (insteadOf applied)
            url = git("remote", "get-url", "--", record.remote, cwd=record.clone)
        raise FetchFailed(str(exc), url) from None


def _fetch(record: Record, branch: str, auth: FetchAuth | None) -> str:
    """Fetch ``branch`` of the record's remote into its remote-tracking ref; its commit."""
    remote = record.remote
    tracking = f"refs/remotes/{remote}/{branch}"
    options = ["--quiet", "--no-tags", "--no-recurse-submodules", "--no-write-fetch-head"]
    refspec = ["--", remote, f"+refs/heads/{branch}:{tracking}"]
    what = f"git fetch {remote} {branch}"
    try:
        _remote(record, auth, "fetch", *options, *refspec, what=what)
    except FetchFailed as exc:
        if "no-write-fetch-head" not in str(exc):
            raise
        # git before 2.29 has no --no-write-fetch-head: it writes .git/FETCH_HEAD then.
        _remote(record, auth, "fetch", *options[:-1], *refspec, what=what)
    return _commit(tracking, record.clone)


def _default_branch(record: Record, auth: FetchAuth | None) -> Start:
    if not record.remote:
        head = _commit("HEAD", record.clone)
        return Start("default_branch", head, head)
    branch = _remote_head(record, auth)
    commit = _fetch(record, branch, auth)
    return Start("default_branch", commit, commit)


def _remote_head(record: Record, auth: FetchAuth | None) -> str:
    """The remote's default branch: as the clone knows it, else as the remote says."""
    prefix = f"refs/remotes/{record.remote}/"
    text = ""
    with contextlib.suppress(OSError):
        text = Path(record.common_dir, prefix, "HEAD").read_text(encoding="utf-8").strip()
    if text.startswith(f"ref: {prefix}"):
        return text.removeprefix(f"ref: {prefix}")
    out = _remote(
        record,
        auth,
        "ls-remote",
        "--symref",
        "--",
        record.remote,
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


def _pull_request(record: Record, ref: str, auth: FetchAuth | None) -> Start:
    if not record.remote:
        raise WorkspaceError(f"{record.clone} has no remote to fetch the pull request from")
    commit = _fetch(record, ref, auth)
    tracking = f"refs/remotes/{record.remote}/{ref}"
    return Start("pull_request", commit, tracking, upstream=f"{record.remote}/{ref}", track=True)


def _local_changes(record: Record, scratch: Path) -> Start:
    clone = record.clone
    try:
        head = _commit("HEAD", clone)
    except GitError:
        raise WorkspaceError(f"{clone} has no commit yet: nothing to start from") from None
    index = os.path.join(clone, git("rev-parse", "--git-path", "index", cwd=clone))
    ensure_private_dir(scratch)
    copy = scratch / f"{record.ticket}.index"
    try:
        if os.path.exists(index):
            shutil.copyfile(index, copy)
        stash = git(
            "stash",
            "create",
            cwd=clone,
            env={"GIT_INDEX_FILE": str(copy)},
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
        cwd=clone,
        what="recording the local changes (git commit-tree)",
    )
    return Start("local_changes", commit, commit)
