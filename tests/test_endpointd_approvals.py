"""Local approvals (`endpointd approvals|approve|deny`) and the audit log (`endpointd audit`).

The daemon's side (request, decision, wait, forget) runs in-process against a state dir in
tmp_path; the user's side is the real CLI in subprocesses sharing that dir. Desktop
notifications are exercised with a fake `notify-send` on PATH.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from endpointd.approvals import APPROVALS_DIR, NO_NOTIFY_ENV, Approvals, summarize
from endpointd.audit import AuditLog
from superagent_proto.v1 import endpoint_pb2 as pb
from tests.cli_output import one_line_error
from tests.helpers import assert_eventually

RULE = 'force-push "git push*--force*"'


@pytest.fixture(autouse=True)
def _quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    # No desktop notifications from tests unless a test asks for them.
    monkeypatch.setenv(NO_NOTIFY_ENV, "1")


def _cli(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "endpointd", *args],
        cwd=tempfile.gettempdir(),
        env={
            **os.environ,
            "ENDPOINTD_CONFIG_DIR": str(state.parent / "config"),
            "ENDPOINTD_STATE_DIR": str(state),
        },
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_request_list_and_approve(tmp_path: Path) -> None:
    state = tmp_path / "state"
    queue = Approvals(state)
    queue.request("cmd_push1", "git push --force origin main", "ticket tkt_9 (worker)", RULE, 300)
    assert queue.decision("cmd_push1") is None

    listed = _cli(state, "approvals")
    assert listed.returncode == 0, listed.stderr
    assert re.search(r"^cmd_push1  waiting \d+s, 4m\d\ds left$", listed.stdout, re.M)
    assert "  command: git push --force origin main" in listed.stdout
    assert "  origin:  ticket tkt_9 (worker)" in listed.stdout
    assert f"  rule:    {RULE}" in listed.stdout
    (row,) = json.loads(_cli(state, "approvals", "--json").stdout)
    assert row["command_id"] == "cmd_push1"
    assert row["rule"] == RULE
    assert 290 < row["seconds_left"] <= 300

    approved = _cli(state, "approve", "cmd_push1")
    assert approved.returncode == 0, approved.stderr
    assert "approved cmd_push1: git push --force origin main" in approved.stdout
    assert queue.decision("cmd_push1") == "approved"
    assert _cli(state, "approvals").stdout == "no commands are waiting for approval\n"

    again = one_line_error(_cli(state, "approve", "cmd_push1"))
    assert "cmd_push1 was already approved" in again
    assert "was already approved" in one_line_error(_cli(state, "deny", "cmd_push1"))
    assert queue.decision("cmd_push1") == "approved"

    queue.forget("cmd_push1")
    assert queue.decision("cmd_push1") is None
    assert "no approval request with id cmd_push1" in one_line_error(
        _cli(state, "approve", "cmd_push1")
    )


def test_deny_unknown_ids_and_prefixes(tmp_path: Path) -> None:
    state = tmp_path / "state"
    queue = Approvals(state)
    queue.request("cmd_aaa111", "rm -r build", "", RULE, 300)
    queue.request("cmd_aab222", "make deploy", "", RULE, 300)

    unknown = one_line_error(_cli(state, "deny", "cmd_zzz"))
    assert "no approval request with id cmd_zzz; `endpointd approvals` lists" in unknown
    ambiguous = one_line_error(_cli(state, "deny", "cmd_aa"))
    assert "matches several pending requests" in ambiguous

    denied = _cli(state, "deny", "cmd_aab")  # a unique prefix is enough
    assert denied.returncode == 0, denied.stderr
    assert "denied cmd_aab222: make deploy" in denied.stdout
    assert queue.decision("cmd_aab222") == "denied"
    assert queue.decision("cmd_aaa111") is None
    assert [r.command_id for r in queue.pending()] == ["cmd_aaa111"]


def test_a_timed_out_request_can_no_longer_be_answered(tmp_path: Path) -> None:
    state = tmp_path / "state"
    queue = Approvals(state)
    queue.request("cmd_late", "deploy", "", RULE, 0)
    assert queue.pending() == []
    assert "timed out" in one_line_error(_cli(state, "approve", "cmd_late"))
    assert queue.decision("cmd_late") is None


def test_requests_are_idempotent_private_and_named_safely(tmp_path: Path) -> None:
    state = tmp_path / "state"
    queue = Approvals(state)
    hostile = "../../../escape"
    queue.request(hostile, "x", "", RULE, 300)
    (first,) = queue.pending()
    queue.request(hostile, "x", "", RULE, 5)  # e.g. after a daemon restart: deadline kept
    (second,) = queue.pending()
    assert second.expires_at == first.expires_at
    files = [p for p in (state / APPROVALS_DIR).iterdir() if p.suffix == ".json"]
    assert len(files) == 1
    assert files[0].parent == state / APPROVALS_DIR
    assert not (tmp_path / "escape").exists()
    assert stat.S_IMODE(files[0].stat().st_mode) == 0o600
    assert stat.S_IMODE((state / APPROVALS_DIR).stat().st_mode) == 0o700


def test_text_from_the_control_plane_cannot_drive_the_terminal(tmp_path: Path) -> None:
    state = tmp_path / "state"
    Approvals(state).request("cmd_esc", "ls\x1b[2J\rnothing to see", "a\nb", RULE, 300)
    listed = _cli(state, "approvals").stdout
    assert "\x1b" not in listed
    assert "\r" not in listed
    assert "ls\\x1b[2J\\rnothing to see" in listed
    assert "origin:  a\\nb" in listed


async def test_the_daemon_waits_for_the_answer_or_the_timeout(tmp_path: Path) -> None:
    queue = Approvals(tmp_path / "state")
    queue.request("cmd_1", "x", "", RULE, 300)
    queue.decide("cmd_1", approve=False)
    assert await queue.wait("cmd_1", 10) == "denied"
    queue.request("cmd_2", "x", "", RULE, 300)
    started = time.monotonic()
    assert await queue.wait("cmd_2", 0.1, interval=0.02) == "timeout"
    assert time.monotonic() - started < 5


def test_summaries_name_credentials_never_values() -> None:
    command = pb.Command(
        command_id="c",
        exec=pb.ExecCommand(argv=["git", "push", "origin", "a b"], cwd="/src/app"),
        credentials=[pb.CredentialRef(name="github-token", delivery=pb.CredentialRef.DELIVERY_ENV)],
    )
    assert summarize(command) == "git push origin 'a b' in /src/app with credentials github-token"
    read = pb.Command(command_id="c", read_file=pb.ReadFile(path="/src/app/.env"))
    assert summarize(read) == "read_file /src/app/.env"


@pytest.mark.skipif(sys.platform != "linux", reason="notify-send is the Linux notifier")
async def test_a_desktop_notification_is_sent_without_blocking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "notified.json"
    fake = bin_dir / "notify-send"
    # Records its arguments, then hangs: the request must not wait for it.
    fake.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys, time\n"
        f"open({str(record)!r} + '.tmp', 'w').write(json.dumps([os.getpid(), sys.argv[1:]]))\n"
        f"os.replace({str(record)!r} + '.tmp', {str(record)!r})\n"
        "time.sleep(60)\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv(NO_NOTIFY_ENV)

    started = time.monotonic()
    Approvals(tmp_path / "state").request("cmd_n1", "terraform apply", "tkt_1", RULE, 300)
    assert time.monotonic() - started < 2
    await assert_eventually(record.exists, timeout=15)
    pid, args = json.loads(record.read_text())
    try:
        assert args[0] == "--app-name=endpointd"
        assert args[1] == "endpointd: approval needed"
        assert "terraform apply" in args[2]
        assert "endpointd approve cmd_n1" in args[2]
    finally:
        os.kill(pid, 9)


def test_audit_log_lines_and_the_cli(tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert _cli(state, "audit").stdout == "the audit log is empty\n"
    log = AuditLog(state)
    log.record("refused", "cmd_1", "allowed_roots", "cwd /etc is outside the allowed roots")
    log.record("approval_timeout", "cmd_2", RULE, "nobody answered within 300 s")
    log.record("denied", "cmd_3", RULE, "denied by the user on the device")
    path = state / "audit.log"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600

    entries = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(e["event"], e["command_id"], e["rule"]) for e in entries] == [
        ("refused", "cmd_1", "allowed_roots"),
        ("approval_timeout", "cmd_2", RULE),
        ("denied", "cmd_3", RULE),
    ]
    assert set(entries[0]) == {"time", "event", "command_id", "rule", "detail"}
    assert entries[0]["time"].endswith("+00:00")

    shown = _cli(state, "audit")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert len(lines) == 3
    assert "refused  cmd_1  allowed_roots: cwd /etc is outside the allowed roots" in lines[0]
    tail = _cli(state, "audit", "--tail", "2", "--json").stdout.splitlines()
    assert [json.loads(line)["command_id"] for line in tail] == ["cmd_2", "cmd_3"]

    # A loosened file is tightened on the next write; a torn line is shown, not hidden.
    path.chmod(0o644)
    with open(path, "a") as f:
        f.write("{torn\n")
    AuditLog(state, redact=lambda s: s.replace("hunter2hunter2", "*" * 14)).record(
        "refused", "cmd_4", "credentials.db.allow", "value hunter2hunter2 leaked into a message"
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert "hunter2hunter2" not in path.read_text()
    last_two = AuditLog(state).tail(2)
    assert last_two[0] == {"event": "unparsable", "detail": "{torn"}
    assert last_two[1]["detail"] == "value ************** leaked into a message"
