"""The attacker's tests for endpointd's own git (issue 31: the daemon's git, a planted
gitfile): nothing a command could have written in a clone makes the daemon's git run a
program, reach another transport, or read a repository the policy denies.

A command working in the owner's clone (an allowed root) can write its ``.git``: config,
``info/attributes``, a ``.git`` file, ``objects/info/alternates``. Each test plants what
such a command would, then prepares a workspace with real git in-process, and looks for
the canary the planted program would leave.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from endpointd.guard import landlock
from endpointd.workspaces import gitdirs
from endpointd.workspaces.errors import WorkspaceError
from endpointd.workspaces.remote_url import transport
from superagent_shared.messages import WorkspaceBase
from tests.endpointd.workspaces.clone_world import A, B, C, World
from tests.endpointd.workspaces.device_world import REMOTE, git

BASES = [WorkspaceBase.DEFAULT_BRANCH, WorkspaceBase.PULL_REQUEST, WorkspaceBase.LOCAL_CHANGES]


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> World:
    made = World(tmp_path)
    made.daemon_environment(monkeypatch)
    return made


def _canaries(world: World) -> Path:
    canaries = world.tmp / "canaries"
    canaries.mkdir(exist_ok=True)
    return canaries


def _touch(canaries: Path, name: str) -> str:
    return f"touch {canaries / name}"


def plant_program_running_config(world: World) -> Path:
    """What a confined command in the owner's clone can append to its ``.git/config`` (and
    ``info/attributes``, an included file): every way we know for git to run a program,
    each leaving its own canary. Returns the canaries' directory."""
    c = _canaries(world)
    git_dir = world.clone / ".git"
    included = world.tmp / "included.config"
    included.write_text(f"[core]\n\tfsmonitor = {_touch(c, 'include-fsmonitor')}\n")
    # The owner's own rewrite goes: the attacker's ext:: rule is the only one for the URL.
    git("config", "--unset-all", f"url.{world.origin.as_uri()}.insteadOf", cwd=world.clone)
    planted = f"""
[protocol]
\tallow = always
[protocol "ext"]
\tallow = always
[url "ext::sh -c {_touch(c, "ext").replace(" ", "% ")}% >&2"]
\tinsteadOf = {REMOTE}
[core]
\tsshCommand = {_touch(c, "ssh-command")}
\tfsmonitor = {_touch(c, "fsmonitor")}
\taskPass = {_touch(c, "askpass")}
\talternateRefsCommand = {_touch(c, "alternate-refs")}
\tgitProxy = {_touch(c, "git-proxy")}
\thooksPath = {world.tmp / "hooks"}
[credential]
\thelper = "!{_touch(c, "credential-helper")}"
[credential "https://github.com"]
\thelper = "!{_touch(c, "credential-helper-url")}"
[remote "origin"]
\tuploadpack = {_touch(c, "uploadpack")}
\tvcs = evil
[filter "evil"]
\tsmudge = "sh -c '{_touch(c, "smudge")}; cat'"
\tclean = "sh -c '{_touch(c, "clean")}; cat'"
\trequired = true
[gpg]
\tprogram = {_touch(c, "gpg")}
[commit]
\tgpgSign = true
[submodule]
\trecurse = true
[include]
\tpath = {included}
[uploadpack]
\tpackObjectsHook = {_touch(c, "pack-objects-hook")}
"""
    with open(git_dir / "config", "a") as f:
        f.write(planted)
    (git_dir / "info").mkdir(exist_ok=True)
    (git_dir / "info" / "attributes").write_text("* filter=evil\n")
    hooks = world.tmp / "hooks"
    hooks.mkdir()
    for hook in ("post-checkout", "reference-transaction", "pre-auto-gc", "post-index-change"):
        (hooks / hook).write_text(f"#!/bin/sh\n{_touch(c, hook)}\n")
        (hooks / hook).chmod(0o755)
    return c


@pytest.mark.parametrize("base", BASES)
def test_config_a_command_planted_in_the_clone_runs_nothing_on_prepare(
    world: World, base: WorkspaceBase
) -> None:
    world.push_to_origin("feature", "feature.py", "z = 3\n")
    (world.clone / "calc.py").write_text("x = 'modified, so a snapshot cleans it'\n")
    canaries = plant_program_running_config(world)
    ref = "feature" if base == WorkspaceBase.PULL_REQUEST else ""
    error = ""
    try:
        answer = world.prepare(base=base, ref=ref)
    except WorkspaceError as exc:
        error = str(exc)
    assert sorted(p.name for p in canaries.iterdir()) == []
    assert error == ""
    ws = Path(str(answer["path"]))
    assert (ws / "README.md").read_text() == "widgets\n"
    if base == WorkspaceBase.PULL_REQUEST:
        assert (ws / "feature.py").read_text() == "z = 3\n"
    if base == WorkspaceBase.LOCAL_CHANGES:
        assert "modified" in (ws / "calc.py").read_text()
    # Released and removed again: still nothing runs.
    world.workspaces.release(A, world.policy)
    world.policy_text("[workspaces]\nretention_hours = 0\n")
    world.workspaces.release(A, world.policy)
    assert not ws.exists()
    assert sorted(p.name for p in canaries.iterdir()) == []


@pytest.mark.parametrize(
    "url",
    [
        "ext::sh -c touch% {canaries}/ext-url% >&2",
        "fd::17",
        "evil::https://github.com/acme/app.git",
        "-u{canaries}/dash",
    ],
)
def test_a_remote_url_for_another_transport_is_refused(world: World, url: str) -> None:
    canaries = _canaries(world)
    git("config", "protocol.allow", "always", cwd=world.clone)
    config = world.clone / ".git" / "config"
    planted = url.format(canaries=canaries).replace("\\", "\\\\").replace('"', '\\"')
    config.write_text(config.read_text().replace(f"url = {REMOTE}", f'url = "{planted}"'))
    with pytest.raises(WorkspaceError, match=r"transport|not a URL endpointd fetches"):
        world.prepare(repo="", path=str(world.clone))
    assert list(canaries.iterdir()) == []
    assert world.workspaces.list() == []


def _denied_repository(world: World) -> tuple[Path, str]:
    """A repository the owner's policy denies (a password store), holding a secret; the
    policy written to deny it. (its directory, the secret)"""
    store = world.tmp / "home" / ".password-store"
    store.mkdir(parents=True)
    git("init", "-q", "-b", "main", str(store), cwd=world.tmp)
    secret = "canary-secret-7f3a"
    (store / "bank.gpg").write_text(secret)
    (store / "README.md").write_text("widgets\n")
    git("add", "-A", cwd=store)
    git("commit", "-qm", "secrets", cwd=store)
    world.policy_text(f"denied_paths = [{json.dumps(str(store))}]\n")
    return store, secret


def _nowhere(world: World, secret: str) -> None:
    """The secret was checked out nowhere endpointd made, and no workspace is recorded."""
    assert [r for r in world.workspaces.list() if not r.in_place] == []
    for path in (world.data / "workspaces").rglob("*") if world.data.exists() else ():
        if path.is_file():
            assert secret not in path.read_text(errors="replace"), path


@pytest.mark.parametrize("base", BASES)
def test_a_planted_gitfile_never_checks_a_denied_repository_out(
    world: World, base: WorkspaceBase
) -> None:
    store, secret = _denied_repository(world)
    folder = world.src / "harmless"
    folder.mkdir()
    (folder / ".git").write_text(f"gitdir: {store / '.git'}\n")
    with pytest.raises(WorkspaceError, match="denied_paths"):
        world.prepare(repo="", path=str(folder), base=base, ref="main")
    _nowhere(world, secret)


def test_a_gitdir_whose_commondir_is_a_denied_repository_is_refused(world: World) -> None:
    store, secret = _denied_repository(world)
    fake = world.src / "fake-admin"
    fake.mkdir()
    (fake / "commondir").write_text(f"{store / '.git'}\n")
    (fake / "HEAD").write_text("ref: refs/heads/main\n")
    (fake / "gitdir").write_text(f"{world.src / 'wt' / '.git'}\n")
    folder = world.src / "wt"
    folder.mkdir()
    (folder / ".git").write_text(f"gitdir: {fake}\n")
    with pytest.raises(WorkspaceError, match="denied_paths"):
        world.prepare(repo="", path=str(folder), base=WorkspaceBase.LOCAL_CHANGES)
    _nowhere(world, secret)


def test_alternates_into_a_denied_repository_are_refused(world: World) -> None:
    store, secret = _denied_repository(world)
    denied_head = git("rev-parse", "HEAD", cwd=store).strip()
    alternates = world.clone / ".git" / "objects" / "info" / "alternates"
    alternates.parent.mkdir(exist_ok=True)
    alternates.write_text(f"{store / '.git' / 'objects'}\n")
    # The clone's HEAD moved to the denied commit, as a command could.
    (world.clone / ".git" / "HEAD").write_text(f"{denied_head}\n")
    for ticket, base in ((A, WorkspaceBase.LOCAL_CHANGES), (B, WorkspaceBase.DEFAULT_BRANCH)):
        with pytest.raises(WorkspaceError, match="denied_paths"):
            world.prepare(ticket, repo="", path=str(world.clone), base=base)
    _nowhere(world, secret)


def test_a_local_remote_in_a_denied_path_is_never_fetched(world: World) -> None:
    store, secret = _denied_repository(world)
    git("remote", "set-url", "origin", str(store), cwd=world.clone)
    git("config", "--unset-all", f"url.{world.origin.as_uri()}.insteadOf", cwd=world.clone)
    with pytest.raises(WorkspaceError, match="denied_paths"):
        world.prepare(C, repo="", path=str(world.clone))
    _nowhere(world, secret)


def test_an_object_store_linked_into_a_denied_repository_is_refused(world: World) -> None:
    store, secret = _denied_repository(world)
    denied_head = git("rev-parse", "HEAD", cwd=store).strip()
    git("gc", "-q", cwd=store)  # its objects in a pack
    pack = next((store / ".git" / "objects" / "pack").glob("*.pack"))
    objects = world.clone / ".git" / "objects" / "pack"
    for suffix in (".pack", ".idx"):
        (objects / f"pack-linked{suffix}").symlink_to(pack.with_suffix(suffix))
    (world.clone / ".git" / "HEAD").write_text(f"{denied_head}\n")
    with pytest.raises(WorkspaceError, match="symbolic link"):
        world.prepare(repo="", path=str(world.clone), base=WorkspaceBase.LOCAL_CHANGES)
    _nowhere(world, secret)
    # The whole object store, linked: judged where it leads.
    for suffix in (".pack", ".idx"):
        (objects / f"pack-linked{suffix}").unlink()
    linked = world.clone / ".git" / "objects"
    linked.rename(world.tmp / "owners-objects")
    linked.symlink_to(store / ".git" / "objects")
    with pytest.raises(WorkspaceError, match="denied_paths"):
        world.prepare(B, repo="", path=str(world.clone), base=WorkspaceBase.LOCAL_CHANGES)
    _nowhere(world, secret)


@pytest.mark.skipif(landlock.abi_version() < 1, reason="needs Landlock")
def test_the_kernel_keeps_git_out_of_a_denied_repository_when_the_check_is_raced(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command may change what the git dirs and alternates say between endpointd's check
    and git's read: as if it won that race (the check sees nothing), the confined git
    still cannot read the denied repository."""
    store, secret = _denied_repository(world)
    monkeypatch.setattr(gitdirs, "judge", lambda *a, **k: None)
    monkeypatch.setattr(gitdirs, "judge_before_git", lambda *a, **k: None)
    denied_head = git("rev-parse", "HEAD", cwd=store).strip()
    alternates = world.clone / ".git" / "objects" / "info" / "alternates"
    alternates.parent.mkdir(exist_ok=True)
    alternates.write_text(f"{store / '.git' / 'objects'}\n")
    (world.clone / ".git" / "HEAD").write_text(f"{denied_head}\n")
    with pytest.raises(WorkspaceError):
        world.prepare(repo="", path=str(world.clone), base=WorkspaceBase.LOCAL_CHANGES)
    _nowhere(world, secret)
    # A planted .git file: git, confined, cannot read where it leads.
    folder = world.src / "harmless"
    folder.mkdir()
    (folder / ".git").write_text(f"gitdir: {store / '.git'}\n")
    try:
        answer = world.prepare(B, repo="", path=str(folder), base=WorkspaceBase.LOCAL_CHANGES)
    except WorkspaceError:
        answer = {}
    assert answer.get("in_place", True) is True  # no checkout of it was made
    assert not (world.data / "workspaces" / B).exists()


@pytest.mark.parametrize(
    "head", ["../../heads/main", "main:refs/heads/main", "-main", "x/../../../heads/main"]
)
def test_a_default_branch_name_planted_in_the_clone_cannot_move_the_owners_refs(
    world: World, head: str
) -> None:
    main = git("rev-parse", "refs/heads/main", cwd=world.clone)
    world.push_to_origin("main", "new.py", "moved\n")
    (world.clone / ".git" / "refs" / "remotes" / "origin" / "HEAD").write_text(
        f"ref: refs/remotes/origin/{head}\n"
    )
    with pytest.raises(WorkspaceError, match="not one endpointd fetches"):
        world.prepare()
    assert git("rev-parse", "refs/heads/main", cwd=world.clone) == main


@pytest.mark.parametrize(
    ("url", "protocol"),
    [
        ("https://github.com/acme/app.git", "https"),
        ("HTTPS://github.com/acme/app", "https"),
        ("http://git.example.com/app.git", "http"),
        ("ssh://git@github.com:2222/acme/app.git", "ssh"),
        ("git+ssh://github.com/acme/app", "ssh"),
        ("git@github.com:acme/app.git", "ssh"),
        ("git://example.com/app.git", "git"),
        ("file:///srv/git/app.git", "file"),
        ("/srv/git/app.git", "file"),
    ],
)
def test_the_transports_endpointd_fetches_over(url: str, protocol: str) -> None:
    assert transport(url, lambda _: None).protocol == protocol


@pytest.mark.parametrize(
    "url",
    [
        "ext::sh -c id",
        "fd::3",
        "hg::https://example.com/app",
        "ftp://example.com/app.git",
        "rsync://example.com/app.git",
        "-oProxyCommand=id:app",
        "relative/path",
        "https://example.com/app\nfetch = evil",
        "",
    ],
)
def test_every_other_url_is_refused(url: str) -> None:
    with pytest.raises(WorkspaceError):
        transport(url, lambda _: None)
    # A local path the policy denies, however it is spelled.
    for spelled in ("/home/o/.password-store", "file:///home/o/.password-store/.git"):
        with pytest.raises(WorkspaceError, match="denied_paths"):
            transport(
                spelled, lambda p: "denied_paths: ~/.password-store" if "password" in p else None
            )


def test_a_clone_found_by_its_remote_is_judged_where_its_git_dir_leads(world: World) -> None:
    store, secret = _denied_repository(world)
    git("remote", "add", "origin", "https://github.com/acme/secrets.git", cwd=store)
    found = world.src / "secrets"
    found.mkdir()
    (found / ".git").symlink_to(store / ".git")
    # The scan follows no symlink, and what it finds is judged where git resolves it.
    with pytest.raises(WorkspaceError, match=r"denied_paths|no clone of"):
        world.prepare(repo="github.com/acme/secrets", base=WorkspaceBase.LOCAL_CHANGES)
    _nowhere(world, secret)
