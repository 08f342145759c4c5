"""PrepareWorkspace and ReleaseWorkspace through the real endpointd: the answer on the
DATA stream, the setup step run once in the sandbox, the release and the retention, a
restart in between, the policy's refusals; and the RepositoryReport after every Hello."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from endpointd.guard import landlock
from superagent_proto.v1 import endpoint_pb2 as pb
from superagent_shared import branches
from tests.endpointd.workspaces.device_world import (
    REPO,
    git,
    make_clone,
    start_device,
    write_policy,
)
from tests.fakes.endpointd_process import Endpointd
from tests.fakes.gateway_server import FakeGateway
from tests.support.helpers import assert_eventually

pytestmark = pytest.mark.skipif(landlock.abi_version() < 6, reason="needs Landlock ABI 6")

A, B = "tkt_aaaaaaaaaaaa", "tkt_bbbbbbbbbbbb"
# The repository's setup step: it counts its runs, shows it is confined to the workspace,
# and fails when told to.
SETUP = """#!/bin/sh
echo run >> .setup-runs
echo "setting up in $(pwd)"
echo pwned >> "$OWNER_README" 2>/dev/null || echo "cannot touch the owner's checkout"
test -e fail-setup && { echo "setup failed on purpose" >&2; exit 3; }
exit 0
"""


# The owner lets the repository's own .superagent/setup run (it does not by default).
OPTED_IN = '[workspaces]\nrepository_setup = ["github.com/acme/*"]\n'


def _exists(path: object, *names: str) -> bool:
    return Path(str(path), *names).exists()


def _setup_script(clone: Path) -> str:
    return SETUP.replace('"$OWNER_README"', str(clone / "README.md"))


async def test_a_workspace_is_prepared_set_up_once_and_found_again_after_a_restart(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    clone = tmp_path / "work" / "app"
    make_clone(tmp_path, {"README.md": "widgets\n", ".superagent/setup": _setup_script(clone)})
    device = await start_device(gw, endpointd, [clone.parent], OPTED_IN)
    _, answer = await device.prepare(A, setup=True)
    ws = endpointd.data_dir / "workspaces" / A
    assert answer["path"] == str(ws)
    assert answer["branch"] == branches.ticket_branch(A)
    assert (answer["created"], answer["in_place"], answer["clone"]) == (True, False, str(clone))
    assert answer["base"] == git("rev-parse", "main", cwd=clone).strip()
    setup = answer["setup"]
    assert isinstance(setup, dict)
    assert (setup["ran"], setup["exit_code"]) == (True, 0)
    assert f"setting up in {ws}" in setup["output_tail"]
    assert "cannot touch the owner's checkout" in setup["output_tail"]
    assert (clone / "README.md").read_text() == "widgets\n"
    # Again, and again after a restart: the same workspace, the setup not run twice.
    endpointd.stop()
    endpointd.start()
    await assert_eventually(lambda: len(gw.hellos(device.device_id)) == 2, timeout=20)
    _, again = await device.prepare(A, setup=True)
    assert again == {**answer, "created": False}
    assert (ws / ".setup-runs").read_text() == "run\n"


async def test_a_failing_setup_keeps_the_workspace_and_the_owners_command_wins(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    clone = tmp_path / "work" / "app"
    files = {
        "README.md": "widgets\n",
        "fail-setup": "yes\n",
        ".superagent/setup": _setup_script(clone),
    }
    make_clone(tmp_path, files)
    device = await start_device(gw, endpointd, [clone.parent], OPTED_IN)
    _, answer = await device.prepare(A, setup=True)
    setup = answer["setup"]
    assert isinstance(setup, dict)
    assert (setup["ran"], setup["exit_code"]) == (True, 3)
    assert "setup failed on purpose" in setup["output_tail"]
    assert _exists(answer["path"], "README.md")
    # The owner's [workspaces.setup] command for the repository runs instead of the script.
    extra = f'[workspaces.setup]\n"{REPO}" = "echo owner-setup; touch by-owner"\n'
    write_policy(endpointd, [clone.parent], extra)
    _, answer = await device.prepare(B, setup=True)
    setup = answer["setup"]
    assert isinstance(setup, dict)
    assert (setup["ran"], setup["exit_code"], setup["output_tail"]) == (True, 0, "owner-setup\n")
    assert _exists(answer["path"], "by-owner")
    assert not _exists(answer["path"], ".setup-runs")
    # Without setup=true nothing runs.
    _, answer = await device.prepare("tkt_cccccccccccc")
    assert answer["setup"] is None


async def test_a_released_workspace_goes_after_the_retention(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    _, clone = make_clone(tmp_path)
    device = await start_device(gw, endpointd, [clone.parent])
    _, a = await device.prepare(A)
    _, b = await device.prepare(B)
    done = await device.release(A)
    assert (done.exit_code, done.error) == (0, "")
    assert _exists(a["path"])  # 72 h by default
    listed = endpointd.cli("workspaces", "list")
    assert listed.returncode == 0, listed.stderr
    shown = rf"{A}  {REPO}  {branches.ticket_branch(A)}  released 0 min ago"
    assert re.search(shown, listed.stdout)
    write_policy(endpointd, [clone.parent], "[workspaces]\nretention_hours = 0\n")
    pruned = endpointd.cli("workspaces", "prune")
    assert pruned.returncode == 0, pruned.stderr
    assert f"removed {A}: {a['path']}, released over 0 h ago" in pruned.stdout
    assert not _exists(a["path"])
    # Released with a retention of 0: gone at once. Releasing again, or an unknown ticket, is fine.
    assert (await device.release(B)).exit_code == 0
    assert not _exists(b["path"])
    assert (await device.release(B)).exit_code == 0
    assert (await device.release("tkt_neverseen0000")).exit_code == 0
    assert git("worktree", "list", "--porcelain", cwd=clone).count("worktree ") == 1


async def test_the_policy_and_validation_refuse_before_anything_is_made(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    _, clone = make_clone(tmp_path)
    device = await start_device(
        gw, endpointd, [clone.parent], '[workspaces]\ndeny = ["github.com/acme/*"]\n'
    )
    bad = pb.Command(prepare_workspace=pb.PrepareWorkspace(ticket_id="../../etc", repo=REPO))
    refused, _ = await device.run(bad)
    assert isinstance(refused, pb.Refused)
    assert refused.reason == pb.Refused.REASON_INVALID
    denied = pb.Command(prepare_workspace=pb.PrepareWorkspace(ticket_id=A, repo=REPO))
    refused, _ = await device.run(denied)
    assert isinstance(refused, pb.Refused)
    assert refused.reason == pb.Refused.REASON_POLICY_DENIED
    assert 'workspaces.deny "github.com/acme/*"' in refused.message
    # A clone the policy allows but that is not there: one line, in Finished.error.
    write_policy(endpointd, [clone.parent])
    done, _ = await device.prepare(A, repo="github.com/acme/nowhere", expect_ok=False)
    assert done.exit_code == 1
    assert done.error == "no clone of github.com/acme/nowhere under this device's allowed roots"
    assert not (endpointd.data_dir / "workspaces" / A).exists()


async def test_the_repositories_are_reported_after_every_hello_and_when_they_change(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    _, clone = make_clone(tmp_path)
    other = tmp_path / "more" / "lib"
    git("init", "-q", "-b", "trunk", str(other), cwd=tmp_path)
    git("remote", "add", "origin", "git@gitlab.com:acme/lib.git", cwd=other)
    device = await start_device(gw, endpointd, [clone.parent])

    def reports() -> list[pb.RepositoryReport]:
        return [m.repositories for m in gw.messages("repositories")]

    def latest() -> list[tuple[str, str, str]]:
        found = reports()
        last = found[-1].repositories if found else []
        return [(r.path, r.remote, r.default_branch) for r in last]

    # (Pairing allowed all of tmp_path; the policy written after it, only the clone's root.)
    await assert_eventually(lambda: latest() == [(str(clone), REPO, "main")], timeout=20)
    assert reports()[-1].truncated is False
    assert reports()[-1].scanned_at.seconds > 0
    # The roots change: a new report, with both.
    write_policy(endpointd, [clone.parent, other.parent])
    both = [(str(other), "gitlab.com/acme/lib", "trunk"), (str(clone), REPO, "main")]  # by path
    await assert_eventually(lambda: latest() == both, timeout=20)
    # Nothing changed: no new report; a new stream: the report again, right after its Hello.
    count = len(reports())
    await asyncio.sleep(6)  # past the daemon's next look at the roots
    assert len(reports()) == count
    gw.drop(device.device_id)
    await assert_eventually(lambda: len(reports()) == count + 1, timeout=30)
    assert latest() == both
    session = [s for s in gw.sessions if s.device_id == device.device_id][-1]
    assert session.hello is not None
    assert session.received[0].WhichOneof("msg") == "repositories"  # the first after the Hello
