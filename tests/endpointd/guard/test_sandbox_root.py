"""A daemon run as root (as CI runs it) against its own commands: they get no capability.

A command of a root daemon ran with every capability (``CapEff 0x1fffeffffff``): it could
``mknod`` a disk device in its workspace, and the sandbox's other layers assume an
unprivileged process. Each test runs a real endpointd and reads what the command itself
sees. The same assertions hold for a daemon run as a normal user.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from endpointd import commanduser
from endpointd.guard import landlock
from superagent_proto.v1 import endpoint_pb2 as pb
from tests.fakes.endpointd_process import Endpointd, start_paired
from tests.fakes.gateway_server import FakeGateway
from tests.support.helpers import assert_eventually

pytestmark = pytest.mark.skipif(landlock.abi_version() < 6, reason="needs Landlock ABI 6")


# What the command sees of its own privileges, and whether it can make a device node.
PROBE = r"""
import json, os, subprocess, sys
status = dict(
    line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line
)
result = {k: status[k].strip() for k in
          ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs")}
try:
    os.mknod("null-device", 0o666 | 0o020000, os.makedev(1, 3))
    result["mknod"] = "made"
except OSError as exc:
    result["mknod"] = "refused %s" % exc.errno
# A set-user-ID (or -group-ID) file of its own, which anyone else would run as its owner.
with open("program", "w") as f:
    f.write("#!/bin/sh\n")
setid = {}
for mode in (0o4755, 0o2755, 0o6755):
    try:
        os.chmod("program", mode)
        setid["chmod %o" % mode] = "made"
    except OSError as exc:
        setid["chmod %o" % mode] = "refused %s" % exc.errno
for name, make in (
    ("open", lambda: os.close(os.open("opened", os.O_CREAT | os.O_WRONLY, 0o4755))),
    ("mknod", lambda: os.mknod("made", 0o100000 | 0o4755)),
):
    try:
        make()
        setid[name] = "made"
    except OSError as exc:
        setid[name] = "refused %s" % exc.errno
os.chmod("program", 0o755)  # an ordinary mode still works
result["setid"] = setid
result["setid_files"] = [
    os.path.join(d, f) for d, _, fs in os.walk(".") for f in fs
    if os.lstat(os.path.join(d, f)).st_mode & 0o6000
]
# Through a fresh program too (what a shell would do): exec regains nothing.
child = subprocess.run(["sh", "-c", "grep ^CapEff /proc/self/status; mknod disk b 8 0"],
                       capture_output=True, text=True)
result["exec"] = child.stdout.split()[-1] if child.stdout.split() else ""
result["exec_mknod"] = child.returncode
print(json.dumps(result), flush=True)
"""


@pytest.mark.parametrize("network", ["allow", "deny", "proxy"])
async def test_a_command_has_no_capability_and_cannot_make_devices_or_setid_files(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path, network: str
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    device = await start_paired(gw, endpointd)
    policy_file = endpointd.config_dir / "policy.toml"
    policy_file.write_text(
        f'allowed_roots = [{json.dumps(str(work))}]\ndefault_action = "allow"\n'
        f'network = "{network}"\n'
    )
    policy_file.chmod(0o600)
    sent = gw.send(
        device, pb.Command(exec=pb.ExecCommand(argv=[sys.executable, "-c", PROBE], cwd=str(work)))
    )
    ended = await assert_eventually(
        lambda: gw.refused(sent.command_id) or gw.finished(sent.command_id), timeout=60
    )
    assert isinstance(ended, pb.Finished), f"refused: {ended}"
    output = gw.output(sent.command_id)
    result = json.loads(output.decode().strip().splitlines()[-1])
    for field in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(result[field], 16) == 0, (field, result)
    assert result["NoNewPrivs"] == "1", result
    assert result["mknod"].startswith("refused"), result
    assert int(result["exec"], 16) == 0, result
    assert result["exec_mknod"] != 0, result
    assert not (work / "null-device").exists()
    assert all(v.startswith("refused") for v in result["setid"].values()), result["setid"]
    assert result["setid_files"] == [], result
    assert (work / "program").stat().st_mode & 0o7777 == 0o755
    assert not (work / "disk").exists()


# Starts what it is given as root without CAP_SETPCAP (as in a container that took it):
# such a daemon cannot take its commands' capabilities away.
_WITHOUT_SETPCAP = """#!{python}
import ctypes, os, sys
if ctypes.CDLL(None, use_errno=True).prctl(24, 8, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
    raise OSError(ctypes.get_errno(), "cannot drop CAP_SETPCAP")
os.execv({python!r}, [{python!r}, *sys.argv[1:]])
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="the case of a daemon run as root")
async def test_a_root_daemon_that_cannot_drop_capabilities_refuses_in_one_line(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrapper = tmp_path / "without-setpcap"
    wrapper.write_text(_WITHOUT_SETPCAP.format(python=sys.executable))
    wrapper.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    with monkeypatch.context() as patched:
        patched.setattr(sys, "executable", str(wrapper))  # how the fixture starts endpointd
        device = await start_paired(gw, endpointd)
        status = endpointd.cli("status")
    policy_file = endpointd.config_dir / "policy.toml"
    policy_file.write_text(f'allowed_roots = [{json.dumps(str(work))}]\ndefault_action = "allow"\n')
    policy_file.chmod(0o600)
    sent = gw.send(device, pb.Command(exec=pb.ExecCommand(argv=["true"], cwd=str(work))))
    refused = await assert_eventually(lambda: gw.refused(sent.command_id), timeout=60)
    assert "CAP_SETPCAP" in refused.message, refused
    assert "\n" not in refused.message, refused
    assert "cannot enforce" in status.stdout, status.stdout
    assert "CAP_SETPCAP" in status.stdout, status.stdout


# What uid 0 would still have without any capability: ownership. A root-owned 0600 file
# in a system directory (in every view, read-only) and the command's own identity.
OWNERSHIP = r"""
import json, os, sys
result = {"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(),
          "groups": os.getgroups()}
try:
    result["secret"] = open(sys.argv[1]).read()
except OSError as exc:
    result["secret"] = "refused %s" % exc.errno
with open("made-here", "w") as f:
    f.write("x")
result["made_uid"] = os.stat("made-here").st_uid
print(json.dumps(result), flush=True)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="the case of a daemon run as root")
async def test_a_root_daemons_command_runs_as_nobody_and_owns_only_what_it_was_granted(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    """Without capabilities a root daemon's command still ran as uid 0, which owns most of
    the machine: it read a root-only file anywhere in its view. It runs as nobody now, and
    its workspace is id-mapped: it writes there as before, and what it writes is root's on
    disk, as the daemon's own files are."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "owners-file").write_text("the owner's\n")
    # A system directory is in every view; a file there only its owner may read.
    secret = Path("/etc") / f"superagent-test-{os.getpid()}-{tmp_path.name}"
    secret.write_text("root-only canary\n")
    secret.chmod(0o600)
    try:
        device = await start_paired(gw, endpointd)
        policy_file = endpointd.config_dir / "policy.toml"
        policy_file.write_text(
            f'allowed_roots = [{json.dumps(str(work))}]\ndefault_action = "allow"\n'
        )
        policy_file.chmod(0o600)
        argv = [sys.executable, "-c", OWNERSHIP, str(secret)]
        sent = gw.send(device, pb.Command(exec=pb.ExecCommand(argv=argv, cwd=str(work))))
        ended = await assert_eventually(
            lambda: gw.refused(sent.command_id) or gw.finished(sent.command_id), timeout=60
        )
        assert isinstance(ended, pb.Finished), f"refused: {ended}"
        assert (ended.exit_code, ended.error) == (0, ""), gw.output(sent.command_id)
        result = json.loads(gw.output(sent.command_id).decode().strip().splitlines()[-1])
    finally:
        secret.unlink()
    assert (result["uid"], result["euid"]) == (commanduser.UID, commanduser.UID), result
    assert (result["gid"], result["groups"]) == (commanduser.GID, []), result
    assert result["secret"].startswith("refused"), result
    # Its own files, to it; root's on disk, beside the owner's.
    assert result["made_uid"] == commanduser.UID, result
    assert (work / "made-here").stat().st_uid == 0
    assert (work / "made-here").read_text() == "x"
