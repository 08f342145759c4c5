"""A workspace per ticket, made with real git in-process: where it starts, that the owner's
checkout is never touched, found again, released, pruned, and within the disk budget."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from endpointd.workspaces import grants, jail
from endpointd.workspaces.errors import WorkspaceError
from endpointd.workspaces.manager import Workspaces
from endpointd.workspaces.store import Store
from superagent_shared import branches
from superagent_shared.messages import WorkspaceBase
from tests.endpointd.workspaces.clone_world import A, B, C, World
from tests.endpointd.workspaces.device_world import git


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> World:
    made = World(tmp_path)
    made.daemon_environment(monkeypatch)
    return made


@pytest.mark.parametrize(
    "base", [WorkspaceBase.DEFAULT_BRANCH, WorkspaceBase.PULL_REQUEST, WorkspaceBase.LOCAL_CHANGES]
)
def test_the_owners_checkout_index_and_stashes_are_never_touched(
    world: World, base: WorkspaceBase
) -> None:
    world.unfinished_work()
    world.push_to_origin("feature", "feature.py", "z = 3\n")
    # A hook that would run on checkout: endpointd runs none of the clone's hooks.
    hook = world.clone / ".git/hooks/post-checkout"
    hook.write_text(f"#!/bin/sh\ntouch {world.tmp / 'hook-ran'}\n")
    hook.chmod(0o755)
    before = world.owner_state()
    answer = world.prepare(base=base, ref="feature" if base == WorkspaceBase.PULL_REQUEST else "")
    after = world.owner_state()
    if base == WorkspaceBase.PULL_REQUEST:
        # The only change: the branch's upstream, so that the workspace follows the PR.
        assert b'[branch "superagent/' in after.pop("config")  # type: ignore[operator]
        before.pop("config")
    assert after == before
    assert not (world.tmp / "hook-ran").exists()
    ws = Path(str(answer["path"]))
    assert ws.parent == world.data / "workspaces"
    assert git("symbolic-ref", "--short", "HEAD", cwd=ws).strip() == branches.ticket_branch(A)
    assert answer["branch"] == branches.ticket_branch(A)
    assert answer["created"] is True
    assert answer["in_place"] is False
    assert answer["clone"] == str(world.clone)


def test_the_default_branch_is_fetched_fresh(world: World) -> None:
    pushed = world.push_to_origin("main", "new.py", "fresh\n")
    answer = world.prepare()
    assert answer["base"] == pushed
    assert (Path(str(answer["path"])) / "new.py").read_text() == "fresh\n"
    # The owner's main is where it was; only their remote-tracking ref moved, as a fetch does.
    assert git("rev-parse", "main", cwd=world.clone).strip() != pushed
    assert git("rev-parse", "origin/main", cwd=world.clone).strip() == pushed


def test_a_pull_request_workspace_starts_at_its_head_and_tracks_it(world: World) -> None:
    head = world.push_to_origin("fix/thing", "fix.py", "fixed\n")
    answer = world.prepare(base=WorkspaceBase.PULL_REQUEST, ref="refs/heads/fix/thing")
    ws = Path(str(answer["path"]))
    assert answer["base"] == head
    assert answer["upstream"] == "origin/fix/thing"
    assert git("rev-parse", "--abbrev-ref", "@{upstream}", cwd=ws).strip() == "origin/fix/thing"
    assert (ws / "fix.py").read_text() == "fixed\n"


def test_local_changes_start_from_a_snapshot_of_the_uncommitted_work(world: World) -> None:
    world.unfinished_work()
    answer = world.prepare(base=WorkspaceBase.LOCAL_CHANGES)
    ws = Path(str(answer["path"]))
    assert (ws / "README.md").read_text() == "widgets, half rewritten\n"
    assert (ws / "draft.py").read_text() == "y = 2\n"
    assert not (ws / "scratch.txt").exists()  # untracked files are not in the snapshot
    assert not (ws / "notes.txt").exists()  # nor is what the owner stashed
    head = git("rev-parse", "HEAD", cwd=world.clone).strip()
    assert git("rev-parse", f"{answer['base']}^", cwd=ws).strip() == head
    assert git("status", "--porcelain", cwd=ws) == ""
    # With nothing uncommitted, it is the owner's HEAD itself.
    git("stash", "-q", "-u", cwd=world.clone)
    assert world.prepare(B, base=WorkspaceBase.LOCAL_CHANGES)["base"] == head


def test_preparing_again_finds_the_same_workspace_even_after_a_restart(world: World) -> None:
    first = world.prepare()
    (Path(str(first["path"])) / "work.txt").write_text("in progress\n")
    world.push_to_origin("main", "later.py", "later\n")
    again = world.prepare()
    assert {**again, "created": True} == first
    assert again["created"] is False
    # A new daemon (a new Workspaces on the same directories) knows it from the record.
    world.workspaces = Workspaces(world.state, world.data)
    assert world.prepare()["created"] is False
    assert (Path(str(first["path"])) / "work.txt").read_text() == "in progress\n"


def test_a_half_made_workspace_is_started_over(world: World) -> None:
    answer = world.prepare()
    store = Store(world.state)
    with store.edit() as records:
        records[A].state = "creating"  # as a crash in the middle of `git worktree add` leaves it
    again = world.prepare()
    assert again["created"] is True
    assert again["path"] == answer["path"]
    assert git("worktree", "list", "--porcelain", cwd=world.clone).count("worktree ") == 2


def test_where_the_request_points(world: World, tmp_path: Path) -> None:
    (world.clone / "pkg").mkdir()
    (world.clone / "pkg/mod.py").write_text("m = 1\n")
    git("add", "-A", cwd=world.clone)
    git("commit", "-qm", "pkg", cwd=world.clone)
    git("push", "-q", "origin", "main", cwd=world.clone)
    # A directory inside the clone: that place, in the ticket's workspace.
    answer = world.prepare(repo="", path=str(world.clone / "pkg"))
    assert answer["path"] == str(world.data / "workspaces" / A / "pkg")
    # A directory that is no repository: used in place.
    plain = world.src / "notes"
    plain.mkdir()
    in_place = world.prepare(B, repo="", path=str(plain))
    assert (in_place["path"], in_place["in_place"], in_place["branch"]) == (str(plain), True, "")
    with pytest.raises(WorkspaceError, match=r"is a clone of github\.com/acme/app, not of"):
        world.prepare(C, repo="github.com/acme/other", path=str(world.clone))
    with pytest.raises(WorkspaceError, match=r"no clone of github\.com/acme/other under"):
        world.prepare(C, repo="github.com/acme/other")
    outside = tmp_path / "outside"
    outside.mkdir()
    with pytest.raises(WorkspaceError, match="outside the allowed roots"):
        world.prepare(C, repo="", path=str(outside))
    # The repository's rules are judged again with what the clone really is.
    world.policy_text('[workspaces]\ndeny = ["github.com/acme/*"]\n')
    with pytest.raises(WorkspaceError, match=r'workspaces\.deny "github\.com/acme/\*"'):
        world.prepare(C, repo="", path=str(world.clone))


def test_a_failed_fetch_is_one_line_and_never_shows_a_password(world: World) -> None:
    git(
        "remote",
        "set-url",
        "origin",
        "https://owner:hunter2-token@127.0.0.1:9/acme/app.git",
        cwd=world.clone,
    )
    with pytest.raises(WorkspaceError) as failed:
        world.prepare(repo="", path=str(world.clone))
    message = str(failed.value)
    assert message.startswith("git fetch origin main failed:"), message
    assert "\n" not in message
    assert "hunter2" not in message
    # Nothing is left behind: no record, no directory, no branch.
    assert world.workspaces.list() == []
    assert not (world.data / "workspaces" / A).exists()
    assert branches.ticket_branch(A) not in git("branch", "--list", cwd=world.clone)


def test_released_workspaces_go_after_the_retention_and_keep_branches_with_work(
    world: World,
) -> None:
    untouched = Path(str(world.prepare(A)["path"]))
    worked = Path(str(world.prepare(B)["path"]))
    (worked / "calc.py").write_text("x = 2\n")
    git("commit", "-qam", "work", cwd=worked)
    for ticket in (A, B):
        assert world.workspaces.release(ticket, world.policy) == []  # 72 h by default
    assert untouched.exists()
    assert worked.exists()
    assert {r.state for r in world.workspaces.list()} == {"released"}
    assert world.workspaces.release("tkt_unknown00000", world.policy) == []
    rules = dataclasses.replace(world.policy.workspace_rules, retention_hours=0)
    removed = {r.ticket: r for r in world.workspaces.prune(world.policy, rules=rules, dry_run=True)}
    assert set(removed) == {A, B}
    assert untouched.exists()
    removed = {r.ticket: r for r in world.workspaces.prune(world.policy, rules=rules)}
    assert (removed[A].branch_kept, removed[B].branch_kept) == (False, True)
    assert not untouched.exists()
    assert not worked.exists()
    listed = git("branch", "--list", cwd=world.clone)
    assert branches.ticket_branch(A) not in listed
    assert branches.ticket_branch(B) in listed
    assert git("worktree", "list", "--porcelain", cwd=world.clone).count("worktree ") == 1
    assert world.workspaces.list() == []
    # The ticket comes back: its workspace continues from its branch.
    again = world.prepare(B)
    assert again["created"] is True
    assert (Path(str(again["path"])) / "calc.py").read_text() == "x = 2\n"


def test_the_disk_budget_removes_released_ones_first_and_never_active_ones(world: World) -> None:
    for i in range(300):
        (world.clone / f"f{i}.txt").write_text("x" * 5000)
    git("add", "-A", cwd=world.clone)
    git("commit", "-qm", "big", cwd=world.clone)
    git("push", "-q", "origin", "main", cwd=world.clone)
    world.policy_text("[workspaces]\nmax_disk_mb = 5\n")  # room for two of about 2.4 MB
    first = Path(str(world.prepare(A)["path"]))
    world.prepare(B)
    with pytest.raises(WorkspaceError, match=r"disk budget would be exceeded: .* 2 active"):
        world.prepare(C)
    assert first.exists()
    world.workspaces.release(A, world.policy)
    assert first.exists()  # released, within its retention: kept while there is room
    assert world.prepare(C)["created"] is True
    assert not first.exists()  # it made room for C
    assert sorted(r.ticket for r in world.workspaces.list()) == [B, C]


def test_every_git_the_daemon_runs_on_a_clone_runs_confined(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ticket's commands write its worktree's admin directory and its branch folder in
    the clone, so no git of the daemon's runs there unconfined: not the prepare's, and not
    the removal's (a released workspace pruned, a half-made one cleaned up), which ran
    without the jail."""
    confined: list[bool] = []
    current = jail.current

    def recording() -> jail.Jail | None:
        found = current()
        confined.append(found is not None)
        return found

    monkeypatch.setattr(jail, "current", recording)
    worked = Path(str(world.prepare(A)["path"]))
    world.prepare(B)
    (worked / "calc.py").write_text("x = 2\n")
    git("commit", "-qam", "work", cwd=worked)
    for ticket in (A, B):
        world.workspaces.release(ticket, world.policy)
    rules = dataclasses.replace(world.policy.workspace_rules, retention_hours=0)
    removed = world.workspaces.prune(world.policy, rules=rules)
    assert {r.ticket for r in removed} == {A, B}
    assert len(confined) > 10
    assert all(confined), confined


def test_a_workspace_from_before_branch_folders_is_made_again_keeping_its_commits(
    world: World,
) -> None:
    """A ticket's branch used to be ``superagent/<ticket>``, which needed every ticket's
    branches writable. A workspace recorded so is made again on
    ``superagent/<ticket>/work``, its branch renamed with its commits, so its commands get
    their own branch folder (and nothing blocks the folder's name)."""
    path = Path(str(world.prepare(A)["path"]))
    (path / "calc.py").write_text("x = 2\n")
    git("commit", "-qam", "work", cwd=path)
    worked = git("rev-parse", "HEAD", cwd=path).strip()
    # As an older endpointd left it: the flat branch, and the record naming it.
    git("worktree", "remove", "--force", str(path), cwd=world.clone)
    git("branch", "-m", branches.ticket_branch(A), f"superagent/{A}", cwd=world.clone)
    with world.workspaces.store.edit() as records:
        records[A].branch = f"superagent/{A}"
    again = world.prepare(A)
    assert again["branch"] == branches.ticket_branch(A)
    assert git("rev-parse", "HEAD", cwd=Path(str(again["path"]))).strip() == worked
    listed = git("branch", "--list", "--format=%(refname:short)", cwd=world.clone).split()
    assert f"superagent/{A}" not in listed
    (record,) = world.workspaces.list()
    assert grants.write_grants(record) != ((), ())
