"""Local approvals (`endpointd approvals|approve|deny`) and the audit log (`endpointd audit`).

The daemon's side (request, decision, wait, forget) runs in-process against a state dir in
tmp_path; the user's side is the real CLI in subprocesses sharing that dir. Desktop
notifications are exercised with a fake `notify-send` on PATH.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from endpointd import wire
from endpointd.audit import AuditLog
from endpointd.guard import daemon_programs
from endpointd.guard.approvals import (
    APPROVALS_DIR,
    KEY_FILE,
    NO_NOTIFY_ENV,
    WRAP_COLUMNS,
    Approvals,
    describe,
    printable,
    summarize,
)
from superagent_proto.v1 import endpoint_pb2 as pb
from tests.support.cli_output import one_line_error
from tests.support.helpers import assert_eventually

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
    # A newline is shown escaped, and the row ends after it: every visible break is ours.
    assert "origin:  a\\n\n           b\n" in listed


async def test_the_daemon_waits_for_the_answer_or_the_timeout(tmp_path: Path) -> None:
    queue = Approvals(tmp_path / "state")
    queue.request("cmd_1", "x", "", RULE, 300)
    queue.decide("cmd_1", approve=False)
    assert await queue.wait("cmd_1", 10) == "denied"
    queue.request("cmd_2", "x", "", RULE, 300)
    started = time.monotonic()
    assert await queue.wait("cmd_2", 0.1, interval=0.02) == "timeout"
    assert time.monotonic() - started < 5


def _request_file(state: Path, command_id: str) -> Path:
    (path,) = [
        p
        for p in (state / APPROVALS_DIR).glob("*.json")
        if json.loads(p.read_text())["command_id"] == command_id
    ]
    return path


def _forge(path: Path, **changes: object) -> None:
    """What a command could do with write access to the queue: rewrite a request file."""
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


async def test_a_decision_file_written_by_hand_is_no_answer(tmp_path: Path) -> None:
    state = tmp_path / "state"
    queue = Approvals(state)
    queue.request("cmd_forged", "make deploy", "", RULE, 300)
    path = _request_file(state, "cmd_forged")
    reported: list[str] = []

    # No MAC at all, then a MAC that is not the key's: neither is an answer.
    _forge(path, decision="approved", decided_at=time.time())
    assert await queue.wait("cmd_forged", 0.3, interval=0.05, on_forged=reported.append) == (
        "timeout"
    )
    _forge(path, decision="approved", decided_at=time.time(), mac="ab" * 32)
    assert queue.decision("cmd_forged", on_forged=reported.append) is None
    assert await queue.wait("cmd_forged", 0.2, interval=0.05) == "timeout"
    assert len(reported) == 1  # reported once per request
    assert "without a valid MAC" in reported[0]

    # The request is put back as the daemon wrote it, and the owner can still answer it.
    assert json.loads(path.read_text())["decision"] is None
    assert [r.command_id for r in queue.pending()] == ["cmd_forged"]
    # A request rewritten to show something harmless is not shown as it was rewritten.
    _forge(path, summary="ls")
    assert queue.decision("cmd_forged") is None
    assert json.loads(path.read_text())["summary"] == "make deploy"
    _forge(path, summary="ls")
    assert "not queued by the running endpointd" in one_line_error(
        _cli(state, "approve", "cmd_forged")
    )
    assert queue.decision("cmd_forged") is None
    approved = _cli(state, "approve", "cmd_forged")
    assert approved.returncode == 0, approved.stderr
    assert queue.decision("cmd_forged") == "approved"
    assert await queue.wait("cmd_forged", 5) == "approved"


def test_a_decision_made_before_a_restart_is_void_after_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = Approvals(state)  # the daemon before a restart
    first.request("cmd_again", "terraform apply", "", RULE, 300)
    key_path = state / APPROVALS_DIR / KEY_FILE
    old_key = key_path.read_bytes()
    assert len(old_key) == 32
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    approved = _cli(state, "approve", "cmd_again")
    assert approved.returncode == 0, approved.stderr
    assert first.decision("cmd_again") == "approved"
    (before,) = [json.loads(p.read_text()) for p in (state / APPROVALS_DIR).glob("*.json")]
    assert re.fullmatch(r"[0-9a-f]{64}", before["mac"])

    second = Approvals(state)  # the restarted daemon: a new key, the old answer is void
    second.request("cmd_again", "terraform apply", "", RULE, 5)
    assert key_path.read_bytes() != old_key
    assert second.decision("cmd_again") is None
    (asked,) = second.pending()  # asked again, with the deadline it had
    assert asked.expires_at == before["expires_at"]
    assert asked.requested_at == before["requested_at"]
    # Replaying the old decision file is no answer either.
    _forge(_request_file(state, "cmd_again"), **{k: before[k] for k in ("decision", "mac")})
    assert second.decision("cmd_again") is None

    denied = _cli(state, "deny", "cmd_again")
    assert denied.returncode == 0, denied.stderr
    assert second.decision("cmd_again") == "denied"


def test_approve_is_refused_when_run_under_an_endpointd_supervisor(tmp_path: Path) -> None:
    state = tmp_path / "state"
    queue = Approvals(state)
    queue.request("cmd_self", "git push --force", "", RULE, 300)
    env = {
        **os.environ,
        "ENDPOINTD_CONFIG_DIR": str(state.parent / "config"),
        "ENDPOINTD_STATE_DIR": str(state),
    }
    # A parent whose command line names endpointd.process.supervisor, as a supervisor's does, runs
    # the CLI through a shell: a grandchild of the "supervisor".
    parent = "import subprocess, sys; sys.exit(subprocess.run(sys.argv[2:]).returncode)"
    for verb in ("approve", "deny"):
        cli = f'"$0" -m endpointd {verb} cmd_self'
        run = subprocess.run(
            [
                sys.executable,
                "-c",
                parent,
                "endpointd.process.supervisor",
                "sh",
                "-c",
                cli,
                sys.executable,
            ],
            cwd=tempfile.gettempdir(),
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
        )
        error = one_line_error(run)
        assert "refused" in error
        assert "endpointd supervisor" in error
        assert queue.decision("cmd_self") is None
    # The same CLI, not under a supervisor, answers.
    assert _cli(state, "approve", "cmd_self").returncode == 0
    assert queue.decision("cmd_self") == "approved"


def test_long_text_is_wrapped_with_its_length_and_hash_and_show_prints_it_all(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    script = "print('start')\n" + "x = 1; " * 700 + "print('THE END')"
    command = pb.Command(
        exec=pb.ExecCommand(
            argv=["python3", "-c", script],
            cwd="/src/app",
            env={"MODE": "fast", "NOTE": "line one\x1b[2J"},
            stdin=b"secret-looking input " * 600,
        ),
        credentials=[
            pb.CredentialRef(name="gh", delivery=pb.CredentialRef.DELIVERY_ENV, env_var="GH"),
            pb.CredentialRef(name="repo", delivery=pb.CredentialRef.DELIVERY_GIT_HELPER),
        ],
    )
    Approvals(state).request(
        "cmd_long",
        summarize(wire.command(command)),
        "tkt_7",
        RULE,
        300,
        details=describe(wire.command(command)),
    )
    joined = shlex.join(command.exec.argv)

    listed = _cli(state, "approvals")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert all(len(line) <= WRAP_COLUMNS for line in lines), listed.stdout
    flat = " ".join(line.strip() for line in lines)
    digest = hashlib.sha256(joined.encode()).hexdigest()
    assert f"… [{len(joined):,} chars, sha256 {digest}; full text: endpointd approvals" in flat
    assert "--show cmd_long]" in flat
    assert "THE END" not in listed.stdout  # cut, and said so
    assert "  cwd:     /src/app" in lines
    assert "  env:     MODE=fast" in lines
    assert "           NOTE=line one\\x1b[2J" in lines
    stdin = command.exec.stdin
    assert f"  stdin:   {len(stdin):,} bytes, sha256 {hashlib.sha256(stdin).hexdigest()}" in lines
    assert "  creds:   gh (env GH)" in lines
    assert "           repo (git helper)" in lines
    assert "\x1b" not in listed.stdout

    shown = _cli(state, "approvals", "--show", "cmd_long")
    assert shown.returncode == 0, shown.stderr
    assert all(len(line) <= WRAP_COLUMNS for line in shown.stdout.splitlines())
    assert "THE END" in shown.stdout
    assert "--show" not in shown.stdout  # nothing cut
    # The argv, unwrapped, is the script exactly (escaped: a newline shows as \n).
    rows = shown.stdout.split("  argv:    ", 1)[1].split("\n  cwd:", 1)[0].split("\n")
    args = "".join(row.removeprefix(" " * 11) for row in rows)
    assert args == "[0] python3[1] -c[2] " + printable(script, None)
    # The stdin preview is 2 KiB of it, and says it is only the start.
    assert "the request keeps only its first 2,048 characters" in " ".join(shown.stdout.split())

    (row,) = json.loads(_cli(state, "approvals", "--json").stdout)
    assert row["details"]["argv"] == list(command.exec.argv)
    assert row["details"]["stdin"]["length"] == len(stdin)
    assert row["details"]["credentials"][1] == {"name": "repo", "delivery": "git helper"}
    whole = json.loads(_cli(state, "approvals", "--show", "cmd_long", "--json").stdout)
    assert whole["details"] == row["details"]


def test_what_a_request_shows_is_redacted_and_complete() -> None:
    secret = "hunter2hunter2"

    def redact(text: str) -> str:
        return text.replace(secret, "*" * len(secret))

    command = pb.Command(
        exec=pb.ExecCommand(
            argv=["deploy", f"--password={secret}"],
            env={"TOKEN_HINT": secret},
            stdin=b"\xff" + secret.encode() + b"\n",
        ),
        credentials=[
            pb.CredentialRef(name="api", delivery=pb.CredentialRef.DELIVERY_FILE, env_var="F"),
            pb.CredentialRef(name="web", delivery=pb.CredentialRef.DELIVERY_HTTP),
        ],
    )
    details = describe(wire.command(command), redact)
    assert secret not in json.dumps(details)
    assert details["argv"] == ["deploy", "--password=" + "*" * 14]
    assert details["env"] == {"TOKEN_HINT": "*" * 14}
    stdin = command.exec.stdin
    assert details["stdin"] == {
        "length": len(stdin),
        "sha256": hashlib.sha256(stdin).hexdigest(),
        "preview": "\udcff" + "*" * 14 + "\n",
        "complete": True,
    }
    assert [c["delivery"] for c in details["credentials"]] == ["file F", "http"]
    assert printable(details["stdin"]["preview"]) == "\\xff**************\\n"
    no_stdin = describe(wire.command(pb.Command(exec=pb.ExecCommand(argv=["ls"]))))
    assert no_stdin["stdin"] is None
    write = describe(
        wire.command(
            pb.Command(write_file=pb.WriteFile(path="/src/a", content=b"x" * 5000, mode=0o600))
        )
    )
    assert write["path"] == "/src/a"
    assert write["mode"] == 0o600
    assert write["content"]["length"] == 5000
    assert write["content"]["preview"] == "x" * 2048
    assert write["content"]["complete"] is False
    # Cut text says how long it was and its hash.
    long = "y" * 1000
    cut = printable(long, 200)
    assert cut.startswith("y" * 200 + "… [1,000 chars, sha256 ")
    assert hashlib.sha256(long.encode()).hexdigest()[:16] in cut


def test_summaries_name_credentials_never_values() -> None:
    command = pb.Command(
        command_id="c",
        exec=pb.ExecCommand(argv=["git", "push", "origin", "a b"], cwd="/src/app"),
        credentials=[pb.CredentialRef(name="github-token", delivery=pb.CredentialRef.DELIVERY_ENV)],
    )
    assert (
        summarize(wire.command(command))
        == "git push origin 'a b' in /src/app with credentials github-token"
    )
    read = pb.Command(command_id="c", read_file=pb.ReadFile(path="/src/app/.env"))
    assert summarize(wire.command(read)) == "read_file /src/app/.env"


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
    # The notifier is found where the daemon finds its programs; a temporary directory is
    # never one of those, so the test names its fake there itself.
    monkeypatch.setattr(
        daemon_programs, "which", lambda name: str(fake) if name == "notify-send" else None
    )
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


def test_approve_and_deny_json_say_what_was_answered(tmp_path: Path) -> None:
    state = tmp_path / "state"
    queue = Approvals(state)
    queue.request("cmd_push1", "git push --force origin main", "ticket tkt_9 (worker)", RULE, 300)
    queue.request("cmd_rm2", "rm -r build", "ticket tkt_9 (worker)", RULE, 300)

    approved = _cli(state, "approve", "cmd_pu", "--json")  # a unique prefix
    assert approved.returncode == 0, approved.stderr
    answer = json.loads(approved.stdout)
    assert answer["command_id"] == "cmd_push1"
    assert answer["decision"] == "approved"
    assert answer["approved"] is True
    assert answer["summary"] == "git push --force origin main"
    assert answer["origin"] == "ticket tkt_9 (worker)"
    assert answer["rule"] == RULE
    assert answer["decided_at"] <= time.time()
    assert "mac" not in answer
    assert queue.decision("cmd_push1") == "approved"

    denied = json.loads(_cli(state, "deny", "cmd_rm2", "--json").stdout)
    assert (denied["command_id"], denied["decision"], denied["approved"]) == (
        "cmd_rm2",
        "denied",
        False,
    )
    assert queue.decision("cmd_rm2") == "denied"

    again = _cli(state, "approve", "cmd_push1", "--json")
    assert "was already approved" in one_line_error(again)
    assert again.stdout == ""
