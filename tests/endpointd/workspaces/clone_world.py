"""An owner's clone and endpointd's directories, for the workspace tests that run the
workspaces in-process with real git: an origin (a bare repository reached through an https
URL), the owner's clone with a commit pushed there, and the device's policy."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from endpointd.guard.policy import Policy
from endpointd.rules.terms import POLICY_FILE
from endpointd.workspaces.manager import Workspaces
from superagent_shared.messages import PrepareWorkspace
from tests.endpointd.workspaces.device_world import REMOTE, REPO, git, origin_rewrite

A, B, C = "tkt_aaaaaaaaaaaa", "tkt_bbbbbbbbbbbb", "tkt_cccccccccccc"


class World:
    """An origin (a bare repository reached through an https URL rewritten to it), the
    owner's clone with unfinished work, and endpointd's directories."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.origin = tmp / "origin.git"
        self.src = tmp / "src"
        self.clone = self.src / "app"
        self.state = tmp / "state"
        self.data = tmp / "data"
        self.config = tmp / "config"
        for d in (self.src, self.state, self.config):
            d.mkdir(parents=True)
        git("init", "-q", "--bare", "-b", "main", str(self.origin), cwd=tmp)
        git("init", "-q", "-b", "main", str(self.clone), cwd=tmp)
        git("config", f"url.{self.origin.as_uri()}.insteadOf", REMOTE, cwd=self.clone)
        git("remote", "add", "origin", REMOTE, cwd=self.clone)
        (self.clone / "README.md").write_text("widgets\n")
        (self.clone / "calc.py").write_text("x = 1\n")
        git("add", "-A", cwd=self.clone)
        git("commit", "-qm", "first", cwd=self.clone)
        git("push", "-q", "origin", "main", cwd=self.clone)
        git("remote", "set-head", "origin", "main", cwd=self.clone)
        self.policy_text("")
        self.workspaces = Workspaces(self.state, self.data)

    def daemon_environment(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The origin's https URL rewritten to it in endpointd's own environment (the
        owner's): endpointd's git reads no clone's, global or system config."""
        for name, value in origin_rewrite(self.origin).items():
            monkeypatch.setenv(name, value)

    def policy_text(self, extra: str) -> None:
        path = self.config / POLICY_FILE
        path.write_text(f"allowed_roots = [{json.dumps(str(self.src))}]\n{extra}")
        path.chmod(0o600)

    @property
    def policy(self) -> Policy:
        return Policy(self.config / POLICY_FILE, state_dir=self.state, data_dir=self.data)

    def prepare(self, ticket: str = A, **fields: object) -> dict[str, object]:
        fields.setdefault("repo", REPO)
        op = PrepareWorkspace(ticket_id=ticket, **fields)  # type: ignore[arg-type]
        return self.workspaces.prepare(op, self.policy).answer()

    def unfinished_work(self) -> None:
        """A stash, a staged new file, a modified file, an untracked file."""
        (self.clone / "notes.txt").write_text("stashed\n")
        git("add", "notes.txt", cwd=self.clone)
        git("stash", "push", "-q", "-m", "owner's experiment", cwd=self.clone)
        (self.clone / "README.md").write_text("widgets, half rewritten\n")
        (self.clone / "draft.py").write_text("y = 2\n")
        git("add", "draft.py", cwd=self.clone)
        (self.clone / "scratch.txt").write_text("untracked\n")

    def owner_state(self) -> dict[str, object]:
        c = self.clone
        return {
            "README.md": (c / "README.md").read_bytes(),
            "draft.py": (c / "draft.py").read_bytes(),
            "scratch.txt": (c / "scratch.txt").read_bytes(),
            "index": (c / ".git/index").read_bytes(),
            "status": git("status", "--porcelain", cwd=c),
            "cached": git("diff", "--cached", cwd=c),
            "diff": git("diff", cwd=c),
            "stash": git("stash", "list", cwd=c),
            "stash_ref": git("rev-parse", "refs/stash", cwd=c),
            "head": git("rev-parse", "HEAD", cwd=c),
            "branch": git("symbolic-ref", "HEAD", cwd=c),
            "fetch_head": os.path.exists(c / ".git/FETCH_HEAD"),
            "config": (c / ".git/config").read_bytes(),
        }

    def push_to_origin(self, branch: str, name: str, content: str) -> str:
        """A commit someone else pushed: on ``branch`` of the origin, not in the clone."""
        other = self.tmp / f"other-{branch.replace('/', '-')}"
        if not other.exists():
            git("clone", "-q", str(self.origin), str(other), cwd=self.tmp)
        git("checkout", "-q", "-B", branch, cwd=other)
        (other / name).write_text(content)
        git("add", "-A", cwd=other)
        git("commit", "-qm", f"{name} on {branch}", cwd=other)
        git("push", "-q", "-f", "origin", f"HEAD:refs/heads/{branch}", cwd=other)
        return git("rev-parse", "HEAD", cwd=other).strip()
