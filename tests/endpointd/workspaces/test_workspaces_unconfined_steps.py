"""The attacker's tests for what the real endpointd runs unconfined (issue 31: its own git,
programs on its PATH, a repository's setup step), played through a scripted gateway
against a real daemon and its real sandbox:

* a confined command in the owner's clone writes program-running git config there, and the
  next PrepareWorkspace must not run it;
* programs planted in a PATH directory that commands can write (under an allowed root) are
  never run by the daemon: not as its git, its ripgrep, a harness's ``--version`` or ssh;
* a repository's ``.superagent/setup`` runs only where the owner's policy opts it in.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from endpointd.guard import landlock
from superagent_proto.v1 import endpoint_pb2 as pb
from tests.endpointd.workspaces.device_world import REPO, git, make_clone, start_device
from tests.fakes.endpointd_process import Endpointd
from tests.fakes.gateway_server import FakeGateway
from tests.support.helpers import assert_eventually

pytestmark = pytest.mark.skipif(landlock.abi_version() < 6, reason="needs Landlock ABI 6")

A, B, C = "tkt_aaaaaaaaaaaa", "tkt_bbbbbbbbbbbb", "tkt_cccccccccccc"
REPO_URL = f"https://{REPO}.git"


def _read(path: object, *names: str) -> str:
    return Path(str(path), *names).read_text()


def _exists(path: object, *names: str) -> bool:
    return Path(str(path), *names).exists()


async def test_config_written_by_a_command_in_the_clone_is_not_run_by_the_next_prepare(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    origin, clone = make_clone(tmp_path, {"README.md": "widgets\n", "calc.py": "x = 1\n"})
    canaries = tmp_path / "canaries"
    canaries.mkdir()
    device = await start_device(gw, endpointd, [clone.parent])
    # The command runs confined, with the owner's clone as its working directory: the
    # sandbox lets it write there (an allowed root), .git/config included.
    rules = "\n".join(
        [
            "git config protocol.ext.allow always",
            "git config protocol.allow always",
            f"git config --unset-all url.{origin.as_uri()}.insteadOf",
            f"git config url.'ext::sh -c touch% {canaries}/ext% >&2'.insteadOf {REPO_URL}",
            f"git config core.sshCommand 'touch {canaries}/ssh'",
            f"git config credential.helper '!touch {canaries}/helper'",
            f"git config remote.origin.uploadpack 'touch {canaries}/uploadpack'",
            f"git config filter.x.smudge 'sh -c \"touch {canaries}/smudge; cat\"'",
            f"git config filter.x.clean 'sh -c \"touch {canaries}/clean; cat\"'",
            "echo '* filter=x' > .git/info/attributes",
            "echo changed >> calc.py",
            "git config --list --local | grep -c ext::",
        ]
    )
    done, out = await device.sh(rules, clone)
    assert done.exit_code == 0, out
    assert out.strip().endswith(b"1"), out
    for ticket, base in (
        (A, pb.PrepareWorkspace.BASE_DEFAULT_BRANCH),
        (B, pb.PrepareWorkspace.BASE_LOCAL_CHANGES),
    ):
        _, answer = await device.prepare(ticket, repo="", path=str(clone), base=base)
        assert _read(answer["path"], "README.md") == "widgets\n"
    assert sorted(p.name for p in canaries.iterdir()) == []


PLANTED = """#!/bin/sh
touch {canaries}/{name}
exit 1
"""


async def test_programs_planted_on_the_daemons_path_are_never_run(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    _, clone = make_clone(tmp_path, {"README.md": "widgets\n", "calc.py": "needle = 1\n"})
    canaries = tmp_path / "canaries"
    canaries.mkdir()
    # A PATH directory inside the allowed root, as ~/.local/bin is under a root of ~: any
    # command could have written these.
    planted = clone.parent / "bin"
    planted.mkdir()
    for name in ("git", "rg", "ssh", "claude", "codex", "qwen", "notify-send"):
        path = planted / name
        path.write_text(PLANTED.format(canaries=canaries, name=name))
        path.chmod(0o755)
    endpointd.env["PATH"] = f"{planted}:{endpointd.env.get('PATH', os.defpath)}"
    device = await start_device(gw, endpointd, [clone.parent])
    _, answer = await device.prepare(A, repo="", path=str(clone))
    assert _read(answer["path"], "README.md") == "widgets\n"
    search = pb.Command(search=pb.Search(pattern="needle", path=str(clone)))
    done, out = await device.finish(search)
    assert done.exit_code == 0, done.error
    assert b"needle = 1" in out
    # The harnesses were looked for (the report after the Hello names them).

    def reported() -> bool:
        return any(
            h.name == "claude" and not h.version
            for m in gw.messages("repositories")
            for h in m.repositories.harnesses
        )

    await assert_eventually(reported, timeout=20, message=endpointd.log()[-3000:])
    assert sorted(p.name for p in canaries.iterdir()) == []


SETUP = """#!/bin/sh
echo ran > setup-ran
echo "the repository's own setup"
"""


async def test_a_repositorys_setup_runs_only_where_the_owner_opts_it_in(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    _, clone = make_clone(tmp_path, {"README.md": "widgets\n", ".superagent/setup": SETUP})
    device = await start_device(gw, endpointd, [clone.parent])
    _, answer = await device.prepare(A, setup=True)
    setup = answer["setup"]
    assert isinstance(setup, dict)
    assert setup["ran"] is False
    assert "[workspaces] repository_setup" in setup["output_tail"]
    assert not _exists(answer["path"], "setup-ran")
    # Opted in by another repository's glob: still not this one.
    extra = '[workspaces]\nrepository_setup = ["github.com/other/*"]\n'
    (endpointd.config_dir / "policy.toml").write_text(
        (endpointd.config_dir / "policy.toml").read_text() + extra
    )
    _, answer = await device.prepare(B, setup=True)
    assert not _exists(answer["path"], "setup-ran")
    # The owner opts this repository in.
    text = (endpointd.config_dir / "policy.toml").read_text()
    (endpointd.config_dir / "policy.toml").write_text(
        text.replace("github.com/other/*", "github.com/acme/*")
    )
    _, answer = await device.prepare(C, setup=True)
    setup = answer["setup"]
    assert isinstance(setup, dict)
    assert (setup["ran"], setup["exit_code"]) == (True, 0), setup
    assert _read(answer["path"], "setup-ran") == "ran\n"
    assert git("status", "--porcelain", cwd=clone) == ""
