"""A rogue command in a ticket's workspace, against the real sandbox: it writes its own
workspace and commits on its own branch, and nothing else of the owner's clone, nor
another ticket's workspace.

Each attack is a command the policy allows (the harm is in what it does once running),
sent by a scripted gateway to the real endpointd, in the ticket's workspace. The kernel
(Landlock) stops it, not a check on the command's text; so the attacks go through a shell
and through git itself.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from endpointd.guard import landlock
from superagent_proto.v1 import endpoint_pb2 as pb
from superagent_shared import branches
from tests.endpointd.workspaces.device_world import (
    Device,
    git,
    make_clone,
    start_device,
)
from tests.fakes.endpointd_process import Endpointd
from tests.fakes.gateway_server import FakeGateway

pytestmark = pytest.mark.skipif(landlock.abi_version() < 6, reason="needs Landlock ABI 6")

A, B = "tkt_aaaaaaaaaaaa", "tkt_bbbbbbbbbbbb"
# Refused by the kernel, or not there at all: another ticket's worktree and the owner's
# working tree are not in a ticket command's view (endpointd.guard.view).
REFUSED = (
    b"Permission denied",
    b"cannot lock",
    b"Cannot save the current status",
    b"Read-only file system",
    b"Directory nonexistent",
    b"No such file or directory",
)


def _fingerprint(root: Path, ticket: str = "") -> dict[str, str]:
    """Every file under ``root`` (the owner's clone, .git included) by content hash, but
    what ``ticket``'s commands may write: its worktree's admin files, its branch and
    reflogs, new loose objects."""
    mine = (
        f".git/worktrees/{ticket}/",
        f".git/refs/heads/superagent/{ticket}/",
        f".git/logs/refs/heads/superagent/{ticket}/",
        f".git/logs/refs/remotes/origin/superagent/{ticket}/",
    )
    out = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        if ticket and (name.startswith(mine) or re.match(r"\.git/objects/[0-9a-f]{2}/", name)):
            continue
        if path.is_file() and not path.is_symlink():
            out[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


async def _two_tickets(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> tuple[Device, Path, Path, Path]:
    _, clone = make_clone(tmp_path, {"README.md": "widgets\n", "calc.py": "x = 1\n"})
    (clone / "README.md").write_text("the owner's unfinished edit\n")
    device = await start_device(gw, endpointd, [clone.parent])
    _, a = await device.prepare(A)
    _, b = await device.prepare(B)
    return device, clone, Path(str(a["path"])), Path(str(b["path"]))


async def test_a_ticket_command_cannot_write_another_workspace_or_the_owners_clone(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    device, clone, ws_a, ws_b = await _two_tickets(gw, endpointd, tmp_path)
    git_dir = clone / ".git"
    admin_b = git_dir / "worktrees" / B
    assert admin_b.is_dir()
    owner_before = _fingerprint(clone, A)
    b_before = _fingerprint(ws_b)
    main_before = git("rev-parse", "refs/heads/main", cwd=clone)
    attacks = {
        "other workspace": f"echo pwned >> {ws_b}/README.md",
        "other workspace, new file": f"echo pwned > {ws_b}/planted.sh",
        "other worktree's index": f"echo pwned > {admin_b}/index",
        "owner's checkout": f"echo pwned >> {clone}/README.md",
        "owner's checkout, new file": f"echo pwned > {clone}/planted.py",
        "hook": f"printf '#!/bin/sh\\necho pwned\\n' > {git_dir}/hooks/pre-commit",
        "hook, replaced": f"mv {git_dir}/hooks/pre-commit.sample {git_dir}/hooks/pre-commit",
        "config": f"printf '[core]\\n\\tfsmonitor = touch /tmp/pwned\\n' >> {git_dir}/config",
        "main, by hand": f"echo {'0' * 40} > {git_dir}/refs/heads/main",
        "main, through git": "git update-ref refs/heads/main HEAD~0 && git log -1 --format=%H main",
        "new branch": "git branch owned-by-agent",
        "packed refs": f"echo pwned >> {git_dir}/packed-refs",
        "stash": "echo change >> calc.py && git stash",
        "packs": f"rm -rf {git_dir}/objects/pack/* {git_dir}/objects/info",
        "alternates": f"echo /tmp > {git_dir}/objects/info/alternates",
        "object dirs": f"mkdir {git_dir}/objects/zz",
        "the other's pointer": f"echo 'gitdir: {git_dir}' > x && mv x {ws_b}/.git",
    }
    for name, script in attacks.items():
        done, out = await device.sh(script, ws_a)
        assert done.exit_code != 0, f"{name}: {out!r}"
        # Refused by the kernel (git says so in its own words), not failed for another reason.
        assert any(word in out for word in REFUSED), (name, out)
        await device.sh("git checkout -q -- . && git clean -qfd", ws_a)
    assert _fingerprint(clone, A) == owner_before
    assert _fingerprint(ws_b) == b_before
    assert git("rev-parse", "refs/heads/main", cwd=clone) == main_before
    assert "owned-by-agent" not in git("branch", "--list", cwd=clone)
    assert git("stash", "list", cwd=clone) == ""


async def test_a_ticket_command_commits_on_its_own_branch(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    device, clone, ws_a, ws_b = await _two_tickets(gw, endpointd, tmp_path)
    owner_before = (clone / "README.md").read_bytes(), git("status", "--porcelain", cwd=clone)
    done, out = await device.sh(
        "echo 'x = 2' > calc.py && echo new > added.txt && git add -A"
        " && git -c user.name=Agent -c user.email=agent@example.com commit -qm 'the fix'"
        " && git log -1 --format=%s && git status --porcelain",
        ws_a,
    )
    assert done.exit_code == 0, out
    assert out == b"the fix\n"  # no warning, nothing left behind
    branch = git("log", "-1", "--format=%s", branches.ticket_branch(A), cwd=clone)
    assert branch == "the fix\n"
    assert git("show", f"{branches.ticket_branch(A)}:calc.py", cwd=clone) == "x = 2\n"
    # The other ticket and the owner saw none of it.
    assert (ws_b / "calc.py").read_text() == "x = 1\n"
    owner_after = (clone / "README.md").read_bytes(), git("status", "--porcelain", cwd=clone)
    assert owner_after == owner_before
    # Writing, reading and listing the workspace with file operations works too.
    write = pb.Command(write_file=pb.WriteFile(path=str(ws_a / "notes.md"), content=b"hi"))
    done, _ = await device.finish(write)
    assert done.exit_code == 0, done.error
    done, out = await device.finish(pb.Command(read_file=pb.ReadFile(path=str(ws_a / "notes.md"))))
    assert out == b"hi"
    # Its .git file (where git finds the repository) is not the agent's to rewrite.
    pointer = pb.Command(write_file=pb.WriteFile(path=str(ws_a / ".git"), content=b"gitdir: /"))
    refused, _ = await device.run(pointer)
    assert isinstance(refused, pb.Refused)
    assert "protected" in refused.message
