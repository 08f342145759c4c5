"""`endpointd workspaces list|prune` (and `endpointd info`'s data dir), as the owner runs
them: real subprocesses on workspaces made with real git."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from endpointd.guard.policy import Policy
from endpointd.rules.terms import POLICY_FILE
from endpointd.workspaces.manager import Workspaces
from superagent_shared import branches
from superagent_shared.messages import PrepareWorkspace
from tests.endpointd.workspaces.device_world import REPO, make_clone, origin_rewrite

A, B = "tkt_aaaaaaaaaaaa", "tkt_bbbbbbbbbbbb"


class Owner:
    def __init__(self, tmp: Path) -> None:
        _, self.clone = make_clone(tmp)
        self.config, self.state, self.data = tmp / "config", tmp / "state", tmp / "data"
        self.config.mkdir()
        policy = self.config / POLICY_FILE
        policy.write_text(f"allowed_roots = [{json.dumps(str(self.clone.parent))}]\n")
        policy.chmod(0o600)
        self.policy = Policy(policy, state_dir=self.state, data_dir=self.data)
        self.workspaces = Workspaces(self.state, self.data)

    def prepare(self, ticket: str) -> Path:
        op = PrepareWorkspace(ticket_id=ticket, repo=REPO)
        return Path(self.workspaces.prepare(op, self.policy).answer()["path"])

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "ENDPOINTD_CONFIG_DIR": str(self.config),
            "ENDPOINTD_STATE_DIR": str(self.state),
            "ENDPOINTD_DATA_DIR": str(self.data),
            "PYTHON_KEYRING_BACKEND": "keyring.backends.fail.Keyring",
        }
        return subprocess.run(
            [sys.executable, "-m", "endpointd", *args],
            env=env,
            cwd=tempfile.gettempdir(),
            capture_output=True,
            text=True,
            timeout=60,
        )


@pytest.fixture
def owner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Owner:
    made = Owner(tmp_path)
    for name, value in origin_rewrite(tmp_path / "origin.git").items():
        monkeypatch.setenv(name, value)  # endpointd's own environment (see device_world)
    return made


@pytest.mark.parametrize("args", [("workspaces",), ("workspaces", "list"), ("workspaces", "prune")])
def test_every_workspaces_command_teaches(owner: Owner, args: tuple[str, ...]) -> None:
    shown = owner.cli(*args, "--help")
    assert shown.returncode == 0, shown.stderr
    summary, paragraph = shown.stdout.split("\n\n")[1:3]
    assert summary.strip(), shown.stdout
    assert len(paragraph.split()) > 25, shown.stdout


def test_list_and_prune_show_and_remove_what_is_released(owner: Owner) -> None:
    assert owner.cli("workspaces", "list").stdout.startswith("no workspaces (they are made under")
    a = owner.prepare(A)
    b = owner.prepare(B)
    owner.workspaces.release(A, owner.policy)
    rows = {r["ticket"]: r for r in json.loads(owner.cli("workspaces", "list", "--json").stdout)}
    assert (rows[A]["state"], rows[B]["state"]) == ("released", "active")
    assert rows[A]["repo"] == REPO
    assert rows[A]["branch"] == branches.ticket_branch(A)
    assert rows[A]["path"] == str(a)
    assert rows[A]["size_bytes"] > 0
    human = owner.cli("workspaces", "list").stdout
    assert f"{B}  {REPO}  {branches.ticket_branch(B)}  active" in human
    assert f"  {b}\n" in human
    # Within the retention, nothing goes; --all-released takes it; --dry-run only says so.
    assert owner.cli("workspaces", "prune").stdout == "nothing to prune\n"
    dry = owner.cli("workspaces", "prune", "--all-released", "--dry-run")
    assert dry.stdout == f"would remove {A}: {a}, released (--all-released)\n"
    assert a.exists()
    done = json.loads(owner.cli("workspaces", "prune", "--all-released", "--json").stdout)
    assert [(r["ticket"], r["branch_kept"], r["error"]) for r in done] == [(A, False, "")]
    assert not a.exists()
    assert b.exists()


def test_info_names_the_data_dir(owner: Owner) -> None:
    shown = owner.cli("info", "--json")
    assert shown.returncode == 0, shown.stderr
    info = json.loads(shown.stdout)
    assert (info["data_dir"], info["data_dir_source"]) == (str(owner.data), "ENDPOINTD_DATA_DIR")
    assert f"data dir:   {owner.data}" in owner.cli("info").stdout


def test_policy_show_includes_the_workspaces_rules(owner: Owner) -> None:
    policy = owner.config / POLICY_FILE
    policy.write_text(
        policy.read_text() + '[workspaces]\nask = ["github.com/acme/*"]\nretention_hours = 1\n'
    )
    shown = owner.cli("policy", "show", "--json")
    assert shown.returncode == 0, shown.stderr
    workspaces = json.loads(shown.stdout)["workspaces"]
    assert workspaces["root"] == str(owner.data / "workspaces")
    assert (workspaces["ask"], workspaces["retention_hours"]) == (["github.com/acme/*"], 1)
    human = owner.cli("policy", "show").stdout
    assert f"workspaces: in {owner.data / 'workspaces'}\n  ask    github.com/acme/*\n" in human
