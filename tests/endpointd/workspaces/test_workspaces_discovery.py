"""The clones under the allowed roots: found cheaply, within bounds, never where they
must not be looked for."""

from __future__ import annotations

import os
import time
from pathlib import Path

from endpointd.workspaces.discovery import Repositories, scan


def _clone(path: Path, remote: str = "", branch: str = "main") -> Path:
    """A clone as the scan sees one: a .git directory with a HEAD and a config (made by
    hand: the scan runs no git, and this makes hundreds)."""
    git = path / ".git"
    git.mkdir(parents=True)
    (git / "HEAD").write_text(f"ref: refs/heads/{branch}\n")
    config = "[core]\n\tbare = false\n"
    if remote:
        config += f'[remote "origin"]\n\turl = {remote}\n'
    (git / "config").write_text(config)
    return path


def _paths(found: object) -> list[str]:
    return [c.path for c in found.repositories]  # type: ignore[attr-defined]


def test_clones_are_found_with_their_remote_and_default_branch(tmp_path: Path) -> None:
    root = tmp_path / "src"
    _clone(root / "app", "git@github.com:acme/app.git")
    _clone(root / "team/lib", "https://github.com/acme/lib.git", branch="trunk")
    _clone(root / "scratch")
    found = scan([str(root)])
    assert [(c.path, c.remote, c.default_branch) for c in found.repositories] == [
        (str(root / "app"), "github.com/acme/app", "main"),
        (str(root / "scratch"), "", "main"),
        (str(root / "team/lib"), "github.com/acme/lib", "trunk"),
    ]
    assert found.truncated is False
    # A root that is itself a clone is reported too.
    assert _paths(scan([str(root / "app")])) == [str(root / "app")]


def test_the_scan_skips_what_it_must_not_enter(tmp_path: Path) -> None:
    root = tmp_path / "src"
    _clone(root / "app")
    _clone(root / "app/vendor/dep")  # inside a clone: the clone's business
    _clone(root / "web/node_modules/pkg")
    _clone(root / ".cache/clone")
    _clone(root / "secret/repo")
    _clone(tmp_path / "elsewhere/repo")
    (root / "link").symlink_to(tmp_path / "elsewhere")  # never followed
    linked = root / "wt"  # a linked worktree: a .git file, not reported
    linked.mkdir()
    (linked / ".git").write_text("gitdir: /somewhere/.git/worktrees/wt\n")
    denied = str(root / "secret")
    found = scan([str(root)], denied=lambda p: p == denied)
    assert _paths(found) == [str(root / "app")]


def test_the_scan_stops_at_its_bounds_and_says_so(tmp_path: Path) -> None:
    root = tmp_path / "src"
    deep = root / "a/b/c/d"
    _clone(deep / "e/too-deep")
    _clone(deep / "shallow-enough")
    found = scan([str(root)], max_depth=5)
    assert _paths(found) == [str(deep / "shallow-enough")]
    assert found.truncated is True  # a/b/c/d/e was not looked into
    for i in range(5):
        _clone(root / f"many/r{i}")
    found = scan([str(root / "many")], max_repositories=3)
    assert len(found.repositories) == 3
    assert found.truncated is True
    assert scan([str(root / "many")]).truncated is False


def test_the_scan_is_cheap_enough_for_a_big_tree(tmp_path: Path) -> None:
    root = tmp_path / "home"
    for i in range(150):
        _clone(root / f"src/team{i % 10}/repo{i}")
        (root / f"notes/dir{i}/sub").mkdir(parents=True)
    started = time.monotonic()
    found = scan([str(root)])
    assert len(found.repositories) == 150
    assert time.monotonic() - started < 2.0


def test_the_last_scan_is_kept_until_the_roots_change(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    _clone(one / "app")
    _clone(two / "lib")
    repositories = Repositories()
    first = repositories.current([str(one)], [], lambda _: False)
    _clone(one / "new")
    assert repositories.current([str(one)], [], lambda _: False) is first
    assert _paths(repositories.current([str(one), str(two)], [], lambda _: False)) == [
        str(one / "app"),
        str(one / "new"),
        str(two / "lib"),
    ]
    # A forced scan, and an old one, look again.
    _clone(two / "other")
    assert str(two / "other") in _paths(
        repositories.current([str(one), str(two)], [], lambda _: False, force=True)
    )
    stale = Repositories(rescan_seconds=0)
    stale.current([str(two)], [], lambda _: False)
    os.rename(two / "other", two / "renamed")
    assert str(two / "renamed") in _paths(stale.current([str(two)], [], lambda _: False))
