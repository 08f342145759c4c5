"""A workspace per ticket: made, found again, released and removed.

:meth:`Workspaces.prepare` turns a PrepareWorkspace into ``<data dir>/workspaces/<ticket>``,
a ``git worktree`` of the device's clone on branch ``superagent/<ticket>/work``, and records it
(:mod:`endpointd.workspaces.store`). Where it starts (:mod:`endpointd.workspaces.bases`):
the freshly fetched default branch, a pull request's branch (tracked, so ``git status``
and ``git pull`` follow the PR), or a snapshot of the user's uncommitted changes. The
user's checkout, index, stashes and uncommitted changes are never touched. Preparing a
ticket again returns its workspace as it is. A directory that is not a git repository is
used in place.

:meth:`Workspaces.release` marks a ticket's workspace released; :meth:`Workspaces.prune`
removes released ones once the policy's retention has passed, and the oldest released ones
first whenever the disk budget is exceeded. An active workspace is never removed: a
prepare that would exceed the budget fails instead. Removing one deletes its branch only
when nothing was committed on it (it still points where it started), so no work is lost.

Everything here is synchronous (git runs as a subprocess): the daemon calls it in a worker
thread, and the CLI directly. One lock (the record's) serialises the daemon and the CLI.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from endpointd.guard.files import within
from endpointd.paths import ensure_private_dir
from endpointd.rules.remotes import matches, normalize, preferred, remotes
from endpointd.workspaces import bases, gitdirs, grants, jail
from endpointd.workspaces.discovery import Repositories, Scan
from endpointd.workspaces.errors import GitError, WorkspaceError
from endpointd.workspaces.git import git, git_ok
from endpointd.workspaces.store import Record, Setup, Store
from endpointd.workspaces.usage import disk_usage, index_estimate
from superagent_shared import branches
from superagent_shared.messages import PrepareWorkspace

if TYPE_CHECKING:
    from endpointd.guard.policy import Policy
    from endpointd.rules.tables import WorkspaceRules

__all__ = ["Prepared", "Removal", "SetupPlan", "Workspaces"]

log = logging.getLogger(__name__)

MB = 1024 * 1024
# How stale a measured size may get before the upkeep measures it again.
SIZE_REFRESH_SECONDS = 3600.0
SETUP_SCRIPT = os.path.join(".superagent", "setup")


@dataclass(frozen=True)
class SetupPlan:
    """The setup step of a new workspace: what to run, or why nothing runs."""

    argv: tuple[str, ...] = ()
    cwd: str = ""
    source: str = ""  # "[workspaces.setup]" or ".superagent/setup"
    not_run: str = ""  # set: it does not run, and this says why


@dataclass(frozen=True)
class Prepared:
    record: Record
    created: bool
    setup: SetupPlan | None  # None: no setup step to run now

    def answer(self) -> dict[str, Any]:
        """The JSON object PrepareWorkspace answers with (see the protocol)."""
        r = self.record
        return {
            "path": r.answer_path,
            "branch": r.branch,
            "base": r.base,
            "clone": r.clone,
            "created": self.created,
            "in_place": r.in_place,
            "setup": asdict(r.setup) if r.setup is not None else None,
            "upstream": r.upstream or None,
        }


@dataclass(frozen=True)
class Removal:
    ticket: str
    path: str
    reason: str
    branch_kept: bool
    error: str = ""


@dataclass(frozen=True)
class _Source:
    """What a prepare works from: a clone (its top level, git dirs, remote) or, in
    place, a plain directory."""

    path: str  # the clone's top level, or the directory used in place
    subdir: str = ""
    git_dir: str = ""
    common_dir: str = ""
    remote_name: str = ""
    repo: str = ""

    @property
    def in_place(self) -> bool:
        return not self.common_dir


class Workspaces:
    """The ticket workspaces under ``<data dir>/workspaces``, recorded in the state dir."""

    def __init__(self, state_directory: Path, data_directory: Path) -> None:
        self.state_directory = state_directory
        # Resolved, as the policy compares working directories (a /tmp that is a symlink).
        self.root = Path(os.path.realpath(data_directory)) / "workspaces"
        self.store = Store(state_directory)
        self.scratch = state_directory / "workspaces-tmp"
        self.repositories = Repositories()

    # ------------------------------------------------------------------ repositories

    def scan(self, policy: Policy, *, force: bool = False) -> Scan:
        """The clones under the policy's allowed roots (the last scan unless stale)."""
        roots = [str(r) for r in policy.allowed_roots]
        denied = [str(d.path) for d in policy.denied_paths]
        return self.repositories.current(
            roots, denied, lambda p: policy.denied_rule(p) is not None, force=force
        )

    # ------------------------------------------------------------------ prepare

    def prepare(
        self,
        op: PrepareWorkspace,
        policy: Policy,
        *,
        approved: bool = False,
        auth: bases.FetchAuth | None = None,
    ) -> Prepared:
        """The ticket's workspace, made now or found again (:class:`WorkspaceError`;
        :class:`FetchFailed` when the remote could not be fetched from). ``auth``: how the
        fetch gets a stored credential, if it may."""
        with self.store.edit() as records:
            found = records.get(op.ticket_id)
            if found is not None and self._intact(found):
                found.state, found.released_at = "active", None
                return Prepared(found, created=False, setup=self._setup_plan(found, op, policy))
            source = self._source(op, policy, approved)
            if found is not None:
                # Half made (a crash) or removed by hand: start over, keeping its branch.
                self._remove(found, policy)
                del records[op.ticket_id]
            if source.in_place:
                record = Record(op.ticket_id, source.path, state="active", in_place=True)
                records[op.ticket_id] = record
                return Prepared(record, created=False, setup=None)
            estimate = index_estimate(os.path.join(source.git_dir, "index"))
            self._make_room(records, estimate, policy)
            record = Record(
                ticket=op.ticket_id,
                path=str(self.root / op.ticket_id),
                repo=source.repo,
                clone=source.path,
                subdir=source.subdir,
                common_dir=source.common_dir,
                remote=source.remote_name,
                branch=branches.ticket_branch(op.ticket_id),
                size_bytes=estimate,
            )
            records[op.ticket_id] = record
            self.store.save(records)  # "creating": a crash from here is cleaned up next time
            try:
                # Confined: it writes only the clone's git dir, the workspace, the scratch.
                with jail.confined(policy, [record.common_dir, self.root, self.scratch]):
                    self._create(record, op, auth, policy)
            except BaseException:
                try:
                    self._remove(record, policy)
                except (WorkspaceError, OSError) as exc:  # the failure that matters is the first
                    log.warning("could not clean up after %s: %s", op.ticket_id, exc)
                del records[op.ticket_id]
                self.store.save(records)
                raise
            record.state = "active"
            return Prepared(record, created=True, setup=self._setup_plan(record, op, policy))

    def record_setup(self, ticket: str, setup: Setup) -> Record | None:
        """Remember the setup step's outcome (it runs once per workspace)."""
        with self.store.edit() as records:
            record = records.get(ticket)
            if record is not None:
                record.setup = setup
            return record

    def _intact(self, record: Record) -> bool:
        if record.state == "creating":
            return False
        if record.in_place:
            return os.path.isdir(record.path)
        if branches.ticket_of(record.branch) != record.ticket:
            return False  # made before each ticket's branch had a folder: made again
        return os.path.isfile(os.path.join(record.path, ".git")) and os.path.isdir(record.admin_dir)

    def _source(self, op: PrepareWorkspace, policy: Policy, approved: bool) -> _Source:
        with jail.confined(policy, ()):  # git only reads here
            return self._judged_source(op, policy, approved)

    def _judged_source(self, op: PrepareWorkspace, policy: Policy, approved: bool) -> _Source:
        if op.path:
            gitdirs.judge_before_git(op.path, policy.denied_rule)
            source = self._source_at(os.path.realpath(op.path), op.path)
            if op.repo and source.repo and not matches(source.repo, op.repo):
                raise WorkspaceError(f"{op.path} is a clone of {source.repo}, not of {op.repo}")
        else:
            source = self._source_of(op.repo, policy)
        decision = policy.check_workspace(source.path, source.repo or op.repo)
        if decision.action == "deny" or (decision.action == "ask" and not approved):
            raise WorkspaceError(decision.message)
        if not source.in_place:
            # What git resolved (a .git file, commondir, alternates) is judged as the
            # path is: a planted one must not lead into a denied repository.
            gitdirs.judge(
                source.git_dir,
                source.common_dir,
                roots=[str(r) for r in policy.allowed_roots],
                denied_rule=policy.denied_rule,
            )
        return source

    def _source_at(self, real: str, given: str) -> _Source:
        if not os.path.isdir(real):
            raise WorkspaceError(f"{given} is not a directory")
        if within(real, os.path.realpath(self.root)):
            raise WorkspaceError(f"{given} is a ticket's workspace, not a clone")
        try:
            out = git(
                "rev-parse",
                "--show-toplevel",
                "--git-dir",
                "--git-common-dir",
                cwd=real,
                what=f"reading the repository at {given}",
            )
        except GitError as exc:
            if "not a git repository" in str(exc):
                return _Source(path=real)
            raise
        lines = out.splitlines()
        if len(lines) != 3:
            raise WorkspaceError(f"{given} is a bare repository or not a checkout")
        top, git_dir, common = (os.path.realpath(os.path.join(real, x)) for x in lines)
        return self._clone_source(top, git_dir, common, subdir=os.path.relpath(real, top))

    def _clone_source(self, top: str, git_dir: str, common: str, subdir: str = "") -> _Source:
        config = ""
        with contextlib.suppress(OSError):
            config = Path(common, "config").read_text(encoding="utf-8", errors="replace")
        name, url = preferred(remotes(config))
        return _Source(
            path=top,
            subdir="" if subdir == "." else subdir,
            git_dir=git_dir,
            common_dir=common,
            remote_name=name,
            repo=normalize(url),
        )

    def _source_of(self, repo: str, policy: Policy) -> _Source:
        for force in (False, True):
            for clone in self.scan(policy, force=force).repositories:
                if matches(clone.remote, repo):
                    # Resolved by git as a given path is, so judged the same way.
                    gitdirs.judge_before_git(clone.path, policy.denied_rule)
                    source = self._source_at(os.path.realpath(clone.path), clone.path)
                    if source.in_place:
                        raise WorkspaceError(f"{clone.path} is no longer a clone git can read")
                    return source
        raise WorkspaceError(f"no clone of {repo} under this device's allowed roots")

    def _create(
        self,
        record: Record,
        op: PrepareWorkspace,
        auth: bases.FetchAuth | None,
        policy: Policy,
    ) -> None:
        ws, clone = record.path, record.clone
        ensure_private_dir(self.root)
        if os.path.lexists(ws):  # left by a crash before the record knew of it
            _remove_tree(ws)
            git_ok("worktree", "prune", cwd=clone)
        legacy = f"{branches.PREFIX}{record.ticket}"
        if git_ok("show-ref", "--verify", "--quiet", f"refs/heads/{legacy}", cwd=clone):
            # The ticket's branch from before each had a folder of its own: renamed, so
            # its commits carry on (and its flat name no longer blocks the folder).
            git("branch", "-m", legacy, record.branch, cwd=clone)
        # The worktree is made without a checkout (which would run the clone's filters
        # and hooks); bases.checkout fills it from endpointd's own git directory.
        if git_ok("show-ref", "--verify", "--quiet", f"refs/heads/{record.branch}", cwd=clone):
            # The ticket's branch outlived an earlier workspace (work was committed on it):
            # carry on from it.
            commit = git(
                "rev-parse", "--verify", f"refs/heads/{record.branch}^{{commit}}", cwd=clone
            )
            git("worktree", "add", "--quiet", "--no-checkout", ws, record.branch, cwd=clone)
            record.base_kind, record.base = "existing_branch", commit
        else:
            start = bases.start(record, op, self.scratch, auth, policy.denied_rule)
            args = ["worktree", "add", "--quiet", "--no-checkout", "-b", record.branch]
            args += ["--track"] if start.track else ["--no-track"]
            git(*args, ws, start.commit_ish, cwd=clone, what="git worktree add")
            record.base_kind, record.base, record.upstream = (
                start.kind,
                start.commit,
                start.upstream,
            )
        record.admin_dir = self._admin_dir(record)
        bases.checkout(self.scratch, record, record.base)
        grants.ensure(record)

    def _admin_dir(self, record: Record) -> str:
        """The worktree's admin directory, read from the ``.git`` file git just wrote (and
        checked to be where a worktree of this clone belongs)."""
        text = Path(record.path, ".git").read_text(encoding="utf-8").strip()
        admin = os.path.realpath(text.removeprefix("gitdir:").strip())
        if os.path.dirname(admin) != os.path.join(record.common_dir, "worktrees"):
            raise WorkspaceError(f"git made the worktree's admin directory at {admin}, unexpected")
        return admin

    def _setup_plan(self, record: Record, op: PrepareWorkspace, policy: Policy) -> SetupPlan | None:
        if not op.setup or record.in_place or record.setup is not None:
            return None
        rules = policy.workspace_rules
        command = rules.setup_for(record.repo)
        if command is not None:
            return SetupPlan(command, record.path, "[workspaces.setup]")
        script = os.path.join(record.path, SETUP_SCRIPT)
        try:
            info = os.lstat(script)
        except OSError:
            return None
        if not rules.runs_repository_setup(record.repo):
            # The repository's own script is its authors' code, not the owner's: it runs
            # only where the owner's policy says so.
            return SetupPlan(
                not_run=f"{SETUP_SCRIPT} is not run: {record.repo or 'this repository'} is not"
                f" listed in [workspaces] repository_setup in {policy.path}",
                source=SETUP_SCRIPT,
            )
        if not os.path.isfile(script) or os.path.islink(script):
            return SetupPlan(not_run=f"{SETUP_SCRIPT} is not a regular file", source=SETUP_SCRIPT)
        if not info.st_mode & 0o100:
            return SetupPlan(
                not_run=f"{SETUP_SCRIPT} is not executable (git update-index --chmod=+x it)",
                source=SETUP_SCRIPT,
            )
        return SetupPlan((script,), record.path, SETUP_SCRIPT)

    # ------------------------------------------------------------------ disk budget

    def _make_room(self, records: dict[str, Record], estimate: int, policy: Policy) -> None:
        """Remove released workspaces, oldest first, until ``estimate`` more bytes fit the
        budget; :class:`WorkspaceError` when only active ones are left."""
        budget = policy.workspace_rules.max_disk_mb * MB
        used = sum(r.size_bytes for r in records.values() if not r.in_place)
        for record in _oldest_released(records.values()):
            if used + estimate <= budget:
                return
            if self._removed(record, "disk budget", policy) is not None:
                used -= record.size_bytes
                del records[record.ticket]
        if used + estimate > budget:
            active = sum(1 for r in records.values() if r.state != "released" and not r.in_place)
            raise WorkspaceError(
                f"the workspaces' disk budget would be exceeded: {used // MB} MB in use by"
                f" {active} active workspace(s) and about {estimate // MB} MB more for this"
                f" one, over max_disk_mb = {policy.workspace_rules.max_disk_mb} ([workspaces]"
                " in the device's policy.toml)"
            )

    # ------------------------------------------------------------------ release, prune

    def release(self, ticket: str, policy: Policy) -> list[Removal]:
        """Mark the ticket's workspace released (an unknown ticket is fine), then prune."""
        with self.store.edit() as records:
            record = records.get(ticket)
            if record is not None and record.state != "released":
                record.state, record.released_at = "released", time.time()
            return self._prune(records, policy, policy.workspace_rules)

    def prune(
        self,
        policy: Policy,
        *,
        rules: WorkspaceRules | None = None,
        all_released: bool = False,
        dry_run: bool = False,
    ) -> list[Removal]:
        """Remove what the retention and the budget (``rules``, else the policy's) say
        should go (``all_released``: every released workspace); ``dry_run``: only say what."""
        rules = rules or policy.workspace_rules
        with self.store.edit() as records:
            return self._prune(records, policy, rules, all_released=all_released, dry_run=dry_run)

    def _prune(
        self,
        records: dict[str, Record],
        policy: Policy,
        rules: WorkspaceRules,
        *,
        all_released: bool = False,
        dry_run: bool = False,
    ) -> list[Removal]:
        now = time.time()
        keep_for = rules.retention_hours * 3600
        budget = rules.max_disk_mb * MB
        used = sum(r.size_bytes for r in records.values() if not r.in_place)
        done: list[Removal] = []
        for record in _oldest_released(records.values()):
            if all_released:
                reason = "released (--all-released)"
            elif now - (record.released_at or now) >= keep_for:
                reason = f"released over {rules.retention_hours} h ago"
            elif used > budget:
                reason = f"over the disk budget of {rules.max_disk_mb} MB"
            else:
                continue
            if dry_run:
                done.append(Removal(record.ticket, record.path, reason, branch_kept=False))
                used -= record.size_bytes
                continue
            removal = self._removed(record, reason, policy)
            if removal is None:
                continue
            done.append(removal)
            if not removal.error:
                used -= record.size_bytes
                del records[record.ticket]
        return done

    def _removed(self, record: Record, reason: str, policy: Policy) -> Removal | None:
        try:
            kept = self._remove(record, policy)
        except (WorkspaceError, OSError) as exc:
            log.warning("could not remove the workspace of %s: %s", record.ticket, exc)
            return Removal(record.ticket, record.path, reason, True, error=str(exc))
        log.info("removed the workspace of %s (%s)", record.ticket, reason)
        return Removal(record.ticket, record.path, reason, branch_kept=kept)

    def _remove(self, record: Record, policy: Policy) -> bool:
        """Delete the worktree (never anything outside the workspaces root); True when the
        branch is kept (it holds commits). Its git runs confined, as a prepare's: the
        worktree's admin directory and its branch folder are what its commands wrote."""
        if record.in_place:
            return False
        with jail.confined(policy, [record.common_dir, self.root]):
            return self._remove_confined(record)

    def _remove_confined(self, record: Record) -> bool:
        ws = os.path.abspath(record.path)
        if not within(ws, str(self.root)) or ws == str(self.root):
            raise WorkspaceError(f"refusing to delete {ws}: not a ticket workspace")
        clone = record.clone if os.path.isdir(record.clone) else ""
        removed = bool(clone) and git_ok("worktree", "remove", "--force", "--force", ws, cwd=clone)
        if not removed:
            # git would not (the clone is gone, or the worktree's files were tampered
            # with): delete what the record knows, and let git forget the rest.
            _remove_tree(ws)
            admin = record.admin_dir
            if admin and os.path.dirname(admin) == os.path.join(record.common_dir, "worktrees"):
                _remove_tree(admin)
            if clone:
                git_ok("worktree", "prune", cwd=clone)
        if not clone:
            return False
        # Only a branch that still points where it started goes: commits are never lost.
        ref = f"refs/heads/{record.branch}"
        if record.base:
            git_ok("update-ref", "-d", ref, record.base, cwd=clone)
        return git_ok("show-ref", "--verify", "--quiet", ref, cwd=clone)

    # ------------------------------------------------------------------ sizes, listing

    def upkeep(self, policy: Policy) -> list[Removal]:
        """Measure the workspaces whose size is stale, then prune (the daemon's timer)."""
        now = time.time()
        stale = [
            r
            for r in self.store.load().values()
            if not r.in_place and r.state != "creating" and now - r.size_at > SIZE_REFRESH_SECONDS
        ]
        sizes = {r.ticket: disk_usage(r.path) for r in stale}
        with self.store.edit() as records:
            for ticket, size in sizes.items():
                if ticket in records:
                    records[ticket].size_bytes, records[ticket].size_at = size, now
            return self._prune(records, policy, policy.workspace_rules)

    def list(self) -> list[Record]:
        """Every recorded workspace, oldest first."""
        return sorted(self.store.load().values(), key=lambda r: r.created_at)

    def record_for(self, workspace: Path | str) -> Record | None:
        """The record of the ticket workspace at ``workspace``, if it is one."""
        path = os.path.realpath(workspace)
        if os.path.dirname(path) != os.path.realpath(self.root):
            return None
        record = self.store.get(os.path.basename(path))
        return record if record is not None and record.path == path else None

    def write_grants(self, workspace: Path | str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """What a command working in ``workspace`` may write in its clone's git directory
        (see :mod:`endpointd.workspaces.grants`); nothing for other directories."""
        record = self.record_for(workspace)
        if record is None:
            return (), ()
        grants.ensure(record)
        return grants.write_grants(record)

    def read_grants(self, workspace: Path | str) -> tuple[str, ...]:
        """What a command working in ``workspace`` may read of its clone (its git
        directory, see :mod:`endpointd.workspaces.grants`); nothing for other directories."""
        record = self.record_for(workspace)
        return grants.read_grants(record) if record is not None else ()


def _oldest_released(records: Iterable[Record]) -> list[Record]:
    released = [r for r in records if r.state == "released"]
    return sorted(released, key=lambda r: r.released_at or 0.0)


def _remove_tree(path: str) -> None:
    """Delete ``path`` without following a symlink anywhere (a link is removed, never its
    target)."""
    if os.path.islink(path) or os.path.isfile(path):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(path)
