"""Which repository a clone is: remotes normalised to host/owner/name, read from the
clone's own files."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from endpointd.rules.remotes import (
    default_branch,
    matches,
    normalize,
    read_clone,
    remote_of,
    remotes,
)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://github.com/acme/app.git", "github.com/acme/app"),
        ("https://github.com/acme/app", "github.com/acme/app"),
        ("https://github.com/acme/app/", "github.com/acme/app"),
        ("https://github.com/acme/app.git/", "github.com/acme/app"),
        ("HTTPS://GitHub.COM/Acme/App.GIT", "github.com/Acme/App"),
        ("http://github.com/acme/app.git", "github.com/acme/app"),
        ("https://user@github.com/acme/app.git", "github.com/acme/app"),
        # A password in the URL never survives: the normalised remote is sent upstream.
        ("https://x-access-token:ghp_s3cret@github.com/acme/app.git", "github.com/acme/app"),
        ("https://github.com:443/acme/app.git", "github.com/acme/app"),
        ("https://github.com/acme/app.git?ref=1#frag", "github.com/acme/app"),
        ("ssh://git@github.com/acme/app.git", "github.com/acme/app"),
        ("ssh://git@github.com:22/acme/app.git", "github.com/acme/app"),
        ("ssh://github.com/acme/app", "github.com/acme/app"),
        ("git+ssh://git@github.com/acme/app.git", "github.com/acme/app"),
        ("ssh+git://git@github.com/acme/app.git", "github.com/acme/app"),
        ("git://github.com/acme/app.git", "github.com/acme/app"),
        ("git@github.com:acme/app.git", "github.com/acme/app"),
        ("git@github.com:acme/app", "github.com/acme/app"),
        ("git@github.com:/acme/app.git", "github.com/acme/app"),
        ("GIT@GitHub.com:Acme/App.git", "github.com/Acme/App"),
        ("github.com:acme/app.git", "github.com/acme/app"),
        ("git@gitlab.com:group/sub/app.git", "gitlab.com/group/sub/app"),
        ("https://gitlab.example.com/group/sub/app.git", "gitlab.example.com/group/sub/app"),
        ("ssh://git@[::1]:2222/acme/app.git", "[::1]/acme/app"),
        ("  https://github.com/acme/app.git\n", "github.com/acme/app"),
        ("https://github.com//acme//app.git", "github.com/acme/app"),
        # No host: a local path, a file URL, nothing, or nonsense.
        ("/srv/git/app.git", ""),
        ("./app.git", ""),
        ("../app", ""),
        ("file:///srv/git/app.git", ""),
        ("C:\\src\\app", ""),
        ("c:/src/app", ""),
        ("", ""),
        ("https://github.com", ""),
        ("https://github.com/", ""),
        ("git@github.com:", ""),
        ("https://github.com/acme\x00/app", ""),
    ],
)
def test_remotes_normalise_to_host_owner_name(url: str, expected: str) -> None:
    assert normalize(url) == expected


@pytest.mark.parametrize(
    ("remote", "wanted", "expected"),
    [
        ("github.com/Acme/App", "github.com/acme/app", True),
        ("github.com/acme/app", "acme/app", True),
        ("github.com/acme/app", "ACME/App", True),
        ("gitlab.com/group/sub/app", "sub/app", True),
        ("github.com/acme/app", "github.com/acme/other", False),
        ("github.com/acme/app", "gitlab.com/acme/app", False),
        ("github.com/acme/app", "me/app", False),
        ("github.com/acme/myapp", "app", False),
        ("", "acme/app", False),
        ("github.com/acme/app", "", False),
    ],
)
def test_a_clone_matches_its_repository_with_or_without_the_host(
    remote: str, wanted: str, expected: bool
) -> None:
    assert matches(remote, wanted) is expected


def test_remotes_are_read_from_a_config_file_in_order() -> None:
    config = """
[core]
	bare = false
[remote "upstream"]
	url = git@github.com:acme/app.git ; the real one
	fetch = +refs/heads/*:refs/remotes/upstream/*
[remote "origin"]
	URL = "https://github.com/me/app.git"
	url = https://mirror.example.com/me/app.git
[remote.old]
	url = https://old.example.com/x/y
[branch "main"]
	url = https://not-a-remote.example.com/a/b
[remote "no-url"]
	fetch = x
"""
    assert remotes(config) == [
        ("upstream", "git@github.com:acme/app.git"),
        ("origin", "https://github.com/me/app.git"),
        ("old", "https://old.example.com/x/y"),
    ]


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def test_a_clone_is_read_without_running_git(tmp_path: Path) -> None:
    clone = tmp_path / "app"
    _git("init", "-q", "-b", "trunk", str(clone), cwd=tmp_path)
    assert read_clone(str(clone)) == read_clone(str(clone))  # no remote yet
    found = read_clone(str(clone))
    assert found is not None
    assert (found.remote, found.default_branch) == ("", "trunk")
    _git("remote", "add", "fork", "git@github.com:me/app.git", cwd=clone)
    _git("remote", "add", "origin", "https://github.com/Acme/App.git", cwd=clone)
    # The remote's default branch, once the clone knows it, wins over the branch checked out.
    (clone / ".git/refs/remotes/origin").mkdir(parents=True)
    (clone / ".git/refs/remotes/origin/HEAD").write_text("ref: refs/remotes/origin/main\n")
    found = read_clone(str(clone))
    assert found is not None
    assert (found.remote_name, found.remote, found.default_branch) == (
        "origin",
        "github.com/Acme/App",
        "main",
    )
    assert default_branch(str(clone / ".git"), "fork") == "trunk"
    assert read_clone(str(tmp_path)) is None


def test_the_remote_of_a_path_inside_a_linked_worktree(tmp_path: Path) -> None:
    clone = tmp_path / "app"
    _git("init", "-q", "-b", "main", str(clone), cwd=tmp_path)
    _git("remote", "add", "origin", "git@github.com:acme/app.git", cwd=clone)
    _git(
        "-c",
        "user.name=n",
        "-c",
        "user.email=e@x",
        "commit",
        "-q",
        "--allow-empty",
        "-m",
        "x",
        cwd=clone,
    )
    _git("worktree", "add", "-q", str(tmp_path / "wt"), cwd=clone)
    (tmp_path / "wt/sub").mkdir()
    assert remote_of(str(tmp_path / "wt/sub")) == "github.com/acme/app"
    assert remote_of(str(clone)) == "github.com/acme/app"
    assert remote_of(str(tmp_path)) == ""
