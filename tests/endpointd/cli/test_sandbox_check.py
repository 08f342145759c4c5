"""`endpointd sandbox check`: the escape-probe suite, run for real on this machine.

Each test runs the real command (a subprocess, as the owner would) under a real policy,
so the probes go through the daemon's executor, supervisor and kernel sandbox. The home
directory is a scratch one per test: the check plants its canaries and sockets there,
never in the home of whoever runs the suite.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from endpointd import checkresult
from endpointd.guard import landlock
from endpointd.sandboxcheck.scene import MARK, Scene
from endpointd.sandboxcheck.suite import CLASS_NAMES
from tests.fakes.endpointd_process import Endpointd, endpointd_in

# The classes today's sandbox contains on this machine under the default policy (the
# shipped example, as `endpointd pair` writes it): every one. Egress is judged separately
# below, since it depends on the policy's network mode. Should a class ever be reported
# escaped under the default policy, this test says which.
EXPECTED_CONTAINED = set(CLASS_NAMES) - {"egress"}

pytestmark = pytest.mark.skipif(landlock.abi_version() < 6, reason="needs Landlock ABI 6")


@pytest.fixture
def home() -> Iterator[Path]:
    """A scratch home with a short path: Unix socket paths are limited to 107 bytes, and
    pytest's tmp_path is long enough to leave the home-socket probe unchecked."""
    path = Path(tempfile.mkdtemp(prefix="h"))
    (path / ".ssh").mkdir(mode=0o700)
    (path / ".ssh" / "id_ed25519").write_text("the owner's real key: never opened\n")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def endpointd(tmp_path: Path, home: Path) -> Iterator[Endpointd]:
    with endpointd_in(tmp_path) as daemon:
        run = home / "run"
        run.mkdir(mode=0o700)
        daemon.env["HOME"] = str(home)
        daemon.env["XDG_RUNTIME_DIR"] = str(run)
        daemon.env.pop("SUPERAGENT_STATE_DIR", None)
        yield daemon


def _default_policy(daemon: Endpointd, *, replace: dict[str, str] | None = None) -> None:
    """The shipped example policy with the test's directory as the allowed root, with
    ``replace``'s lines swapped in (``'network = "allow"'`` → ``'network = "deny"'``)."""
    made = daemon.cli("policy", "init", "--allow-root", str(daemon.root.parent))
    assert made.returncode == 0, made.stderr
    path = daemon.config_dir / "policy.toml"
    text = path.read_text()
    for old, new in (replace or {}).items():
        assert old in text, old
        text = text.replace(old, new)
    path.write_text(text)
    path.chmod(0o600)


def _check(daemon: Endpointd) -> tuple[int, dict[str, Any], str]:
    """Run the check; its exit status, its JSON report, and its human output (a second
    run's, from the same state)."""
    proc = daemon.cli("sandbox", "check", "--json")
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout, proc.stderr
    report = json.loads(proc.stdout)
    return proc.returncode, report, proc.stdout


def _outcomes(report: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["outcome"] for c in report["classes"]}


def _tree(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")}


def test_with_the_sandbox_off_the_check_fails_and_names_what_escaped(
    endpointd: Endpointd, home: Path
) -> None:
    _default_policy(endpointd, replace={'sandbox = "required"': 'sandbox = "off"'})
    before = _tree(home)
    proc = endpointd.cli("sandbox", "check")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    out = proc.stdout
    assert "Traceback" not in proc.stderr
    for name in ("persistence", "reads", "cross-workspace"):
        assert f"{name}" in out
    assert "escaped: read a file in ~/.ssh: read the canary" in out, out
    assert "escaped: append to a shell start-up file (~/.bashrc)" in out, out
    assert 'fix: sandbox = "off" in policy.toml: set sandbox = "required"' in out, out
    assert out.strip().splitlines()[-1].startswith("escaped: persistence, sockets, ")
    # The saved result says the same, and everything planted is gone again.
    saved = checkresult.load(endpointd.state_dir)
    assert saved is not None
    assert {"persistence", "reads", "cross-workspace", "sockets"} <= set(saved.escaped)
    assert _tree(home) == before
    assert (home / ".ssh" / "id_ed25519").read_text() == "the owner's real key: never opened\n"
    assert not list((endpointd.data_dir / "workspaces").glob(f"{MARK}-*"))
    assert [p.name for p in endpointd.state_dir.iterdir()] == [checkresult.FILE]


@pytest.mark.parametrize(
    ("network", "egress"), [("allow", "allowed"), ("deny", "contained"), ("proxy", "contained")]
)
def test_the_default_policy_contains_what_todays_sandbox_contains(
    endpointd: Endpointd, network: str, egress: str
) -> None:
    # "proxy" is contained by the command's network namespace, whose only way out is the
    # proxy: no other address on the proxy's port is reachable (issue 31, finding 4).
    _default_policy(endpointd, replace={'network = "allow"': f'network = "{network}"'})
    code, report, _ = _check(endpointd)
    outcomes = _outcomes(report)
    assert set(outcomes) == set(CLASS_NAMES)
    assert outcomes.pop("egress") == egress, report
    expected = {name: "contained" for name in EXPECTED_CONTAINED}
    expected |= {name: "escaped" for name in outcomes if name not in EXPECTED_CONTAINED}
    assert outcomes == expected, json.dumps(report, indent=2)
    escaped = [n for n, o in _outcomes(report).items() if o == "escaped"]
    assert code == (3 if escaped else 0)
    for c in report["classes"]:
        assert not c["escaped"] or c["fix"], c  # every escape names its fix


def test_status_shows_the_last_result_and_when_the_policy_changed_since(
    endpointd: Endpointd,
) -> None:
    _default_policy(endpointd)
    status = endpointd.cli("status")
    assert status.returncode == 0, status.stderr
    assert "sandbox check: never run (`endpointd sandbox check`" in status.stdout

    _, report, _ = _check(endpointd)
    status = endpointd.cli("status")
    escaped = [n for n, o in _outcomes(report).items() if o == "escaped"]
    line = next(x for x in status.stdout.splitlines() if x.startswith("sandbox check:"))
    if escaped:
        assert f"ESCAPED: {', '.join(escaped)}" in line, line
    else:
        assert "contained" in line, line
    assert report["policy_sha256"][:12] in line
    shown = json.loads(endpointd.cli("status", "--json").stdout)["sandbox_check"]
    assert shown["ran"]
    assert not shown["stale"]
    assert shown["classes"] == report["classes"]

    # A policy edit makes the result stale, and status says so.
    policy = endpointd.config_dir / "policy.toml"
    policy.write_text(policy.read_text().replace('network = "allow"', 'network = "deny"'))
    status = endpointd.cli("status")
    assert "the policy has changed since: run `endpointd sandbox check` again" in status.stdout
    assert json.loads(endpointd.cli("status", "--json").stdout)["sandbox_check"]["stale"]


def test_bad_input_and_missing_state_give_one_clear_line(endpointd: Endpointd) -> None:
    # No policy at all: nothing to check, and the way out.
    proc = endpointd.cli("sandbox", "check")
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: the policy cannot be used: "), proc.stderr
    assert "endpointd policy init" in proc.stderr
    assert "Traceback" not in proc.stderr
    # A policy with an unknown key: its line and key are named.
    endpointd.config_dir.mkdir(parents=True, exist_ok=True)
    policy = endpointd.config_dir / "policy.toml"
    policy.write_text(f'allowed_roots = ["{endpointd.root.parent}"]\nsandbx = "off"\n')
    policy.chmod(0o600)
    proc = endpointd.cli("sandbox", "check")
    assert proc.returncode == 1
    assert "unknown key 'sandbx'" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    # Unknown options are usage errors.
    proc = endpointd.cli("sandbox", "check", "--everything")
    assert proc.returncode == 2
    assert "No such option '--everything'" in proc.stderr
    # A damaged result file: status still answers, and says what to do.
    endpointd.state_dir.mkdir(parents=True, exist_ok=True)
    (endpointd.state_dir / checkresult.FILE).write_text('{"classes": 3')
    status = endpointd.cli("status")
    assert status.returncode == 0, status.stderr
    assert "sandbox check: unreadable: " in status.stdout
    assert "run `endpointd sandbox check` again" in status.stdout
    (endpointd.state_dir / checkresult.FILE).write_text('{"classes": [{"name": 1}]}')
    status = endpointd.cli("status", "--json")
    assert status.returncode == 0, status.stderr
    assert "malformed" in json.loads(status.stdout)["sandbox_check"]["error"]


def test_help_says_what_it_does_and_that_it_is_safe() -> None:
    from click.testing import CliRunner

    from endpointd.cli import cli

    shown = CliRunner().invoke(cli, ["sandbox", "check", "--help"]).output
    for words in ("escape probes", "same executor and", "safe to run", "contained", "escaped"):
        assert words in " ".join(shown.split()), shown
    assert "sandbox check" in CliRunner().invoke(cli, ["sandbox", "--help"]).output


def test_the_scene_removes_everything_it_planted(tmp_path: Path, home: Path) -> None:
    """Even without a probe run: every planted file, socket, listener and directory goes,
    and a file of the owner's that was there before (~/.bashrc) stays as it was."""
    (home / ".bashrc").write_text("# the owner's\n")
    before = _tree(home)
    scene = Scene(
        home=home,
        workspaces_root=tmp_path / "data" / "workspaces",
        scratch_parent=tmp_path / "data" / MARK,
        endpointd_state=tmp_path / "state",
        endpointd_config=tmp_path / "config",
        controlplane_state=home / ".local" / "share" / "superagent",
    )
    scene.plant()
    planted = [t for t in scene.targets.values() if t.startswith("/")]
    assert any(Path(t).exists() for t in planted)
    address = scene.targets["loopback"].rpartition(":")
    scene.remove()
    assert _tree(home) == before
    assert (home / ".bashrc").read_text() == "# the owner's\n"
    assert not (tmp_path / "data").exists()
    for target in planted:
        # Not the check's: a pty's device node, the owner's ~/.bashrc, /proc/self/status.
        if not target.startswith(("/dev/pts/", str(home / ".bashrc"), "/proc/self/")):
            assert not os.path.lexists(target), target
    with pytest.raises(ConnectionRefusedError), socket.socket() as s:
        s.connect((address[0], int(address[2])))


# Probes whose outcome depends on the command's workspace: the check runs in a ticket
# worktree (its branch directory is granted, and mknod is tried in it), the daemon's
# command below in the allowed root.
_WORKSPACE_BOUND = {"other_ref", "mknod"}


async def test_the_probes_fare_in_the_check_as_in_a_command_the_daemon_runs(
    endpointd: Endpointd, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a simulation: the same probe command, against the same planted targets, sent
    by a gateway to a running daemon, gets the same outcome probe by probe as in the
    check."""
    from endpointd.guard.policy import load_policy
    from endpointd.sandboxcheck import check
    from superagent_proto.v1 import endpoint_pb2 as pb
    from tests.fakes.endpointd_process import start_paired
    from tests.fakes.gateway_server import FakeGateway
    from tests.support.helpers import assert_eventually

    for name in ("HOME", "XDG_RUNTIME_DIR", *(k for k in endpointd.env if "ENDPOINTD_" in k)):
        monkeypatch.setenv(name, endpointd.env[name])
    monkeypatch.delenv("SUPERAGENT_STATE_DIR", raising=False)
    with FakeGateway() as gw:
        device = await start_paired(gw, endpointd)  # the default policy, as pairing writes it
        # ... but for one directory the owner lets commands write (~/.local/bin): so that
        # a probe succeeds in both, now that the view contains all the others.
        policy_file = endpointd.config_dir / "policy.toml"
        text = policy_file.read_text()
        assert "\nwritable_paths = []\n" in text
        granted = f"\nwritable_paths = [{json.dumps(str(home / '.local' / 'bin'))}]\n"
        policy_file.write_text(text.replace("\nwritable_paths = []\n", granted))
        policy = load_policy(
            endpointd.config_dir,
            state_directory=endpointd.state_dir,
            data_directory=endpointd.data_dir,
        )
        assert policy.rules is not None
        assert policy.rules.network == "allow"
        scene = Scene(
            home=home,
            workspaces_root=policy.workspaces_root,
            scratch_parent=endpointd.data_dir / MARK,
            endpointd_state=endpointd.state_dir,
            endpointd_config=endpointd.config_dir,
            controlplane_state=check.controlplane_state_dir(endpointd.state_dir),
        )
        spool = endpointd.private / "check-spool"
        scene.plant()
        try:
            stdin = check.probe_input(scene, allowed_egress=True)
            sent = gw.send(
                device,
                pb.Command(
                    exec=pb.ExecCommand(
                        argv=list(check.probe_argv()), cwd=str(endpointd.root.parent), stdin=stdin
                    )
                ),
            )
            ended = await assert_eventually(
                lambda: gw.refused(sent.command_id) or gw.finished(sent.command_id), timeout=60
            )
            assert isinstance(ended, pb.Finished), ended
            by_daemon = check.parse_output(gw.output(sent.command_id))
            spool.mkdir()
            run, _ = check.run_probes(policy, policy.rules, scene, spool, None, [])
        finally:
            scene.remove()
    targets = {i: probe.target for i, _, probe in check._probes()}
    compared = {i for i in by_daemon if targets[i] not in _WORKSPACE_BOUND}
    assert len(compared) >= 20, by_daemon
    assert {i: run.outcomes[i][0] for i in compared} == {i: by_daemon[i][0] for i in compared}
    # Both outcomes occur, so the comparison says something.
    assert {by_daemon[i][0] for i in compared} == {True, False}
