"""Which directories of its PATH the daemon runs its own programs from (git, rg, ssh, a
harness's --version): never one a command could write, whatever lies there."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from endpointd.guard import daemon_programs
from endpointd.rules.errors import PolicyError
from endpointd.rules.parser import parse_policy

GIT = shutil.which("git", path="/usr/bin:/bin")


@pytest.mark.skipif(GIT is None, reason="needs git in /usr/bin or /bin")
def test_a_directory_inside_an_allowed_root_or_the_home_directory_is_never_used(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert GIT is not None
    system = os.path.dirname(os.path.realpath(GIT))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    trusted = daemon_programs.resolve(system, ())
    assert trusted.directories == (system,)
    assert trusted.which("git") == os.path.realpath(GIT)
    # The same directory, now inside a place commands may write (an allowed root of "/usr"):
    # nothing is found there, and the reason is kept for the log.
    root = os.path.dirname(system)
    inside = daemon_programs.resolve(system, (root,))
    assert inside.directories == ()
    assert inside.which("git") is None
    assert inside.skipped == ((system, f"{system} is inside {root}, where commands may write"),)
    # Under the home directory: not unless the owner lists it in program_paths, and then
    # not if it holds a place commands may write (~/.local/bin under a root of ~).
    monkeypatch.setenv("HOME", root)
    assert daemon_programs.resolve(system, ()).which("git") is None
    assert daemon_programs.resolve(system, (), (system,)).which("git") == os.path.realpath(GIT)
    assert daemon_programs.resolve(system, (root,), (system,)).which("git") is None
    assert daemon_programs.resolve(system, (system + "/x",), (system,)).which("git") is None


def test_a_directory_others_can_write_is_never_used(tmp_path: Path) -> None:
    def planted(directory: Path) -> Path:
        directory.mkdir(parents=True)
        (directory / "git").write_text("#!/bin/sh\nexit 0\n")
        (directory / "git").chmod(0o755)
        return directory

    # Everybody may write it (even sticky: anybody could add a program), or a directory
    # above it that is not root's sticky one (anybody could swap what is below).
    shared = planted(tmp_path / "shared")
    shared.chmod(0o1777)
    open_above = tmp_path / "open"
    below_open = planted(open_above / "bin")
    open_above.chmod(0o777)
    found = daemon_programs.resolve(f"{shared}:{below_open}:relative/bin", ())
    assert found.which("git") not in (str(shared / "git"), str(below_open / "git"))
    reasons = dict(found.skipped)
    assert "relative/bin" in reasons
    assert reasons[str(shared)] == f"{shared} is writable by group or others"
    assert reasons[str(below_open)] == f"{open_above} is writable by group or others"


@pytest.mark.skipif(os.geteuid() != 0, reason="a sticky directory of root's needs root to make")
def test_a_directory_below_a_sticky_directory_of_roots_is_used(tmp_path: Path) -> None:
    # /tmp: everybody writes it, but nobody can rename or remove another's entry; what is
    # below it is judged on its own (a clone of the project under /tmp, say).
    sticky = tmp_path / "sticky"
    sticky.mkdir(mode=0o755)
    mine = sticky / "bin"
    mine.mkdir(mode=0o755)
    (mine / "git").write_text("#!/bin/sh\nexit 0\n")
    (mine / "git").chmod(0o755)
    sticky.chmod(0o1777)
    found = daemon_programs.resolve(str(mine), ())
    assert found.which("git") == str(mine / "git"), found.skipped


def test_program_paths_is_the_owners_list_of_home_directories(tmp_path: Path) -> None:
    home = tmp_path / "home"
    text = 'allowed_roots = ["~/src"]\nprogram_paths = ["~/.local/bin"]\n'
    rules = parse_policy(text, tmp_path / "policy.toml", home)
    assert rules.program_paths == (home / ".local" / "bin",)
    assert parse_policy("allowed_roots = []\n", tmp_path / "p.toml", home).program_paths == ()
    with pytest.raises(PolicyError, match="program_paths"):
        parse_policy('program_paths = "~/bin"\n', tmp_path / "policy.toml", home)
