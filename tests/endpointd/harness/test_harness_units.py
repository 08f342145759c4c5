"""The harness runs, the [harness] policy's checks, detection and `endpointd harness list`, with
small fake executables standing in for the CLIs (only Qwen Code runs for real, in
test_harness_daemon.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from endpointd import wire
from endpointd.guard.approvals import describe, summarize
from endpointd.guard.policy import Policy
from endpointd.harness import detect, runs
from endpointd.rules.parser import parse_policy
from superagent_proto.v1 import endpoint_pb2 as pb
from superagent_shared.messages import (
    Command,
    CredentialRef,
    Delivery,
    Harness,
    HarnessExec,
    Reason,
    Repository,
    RunHarness,
)


def _program(directory: Path, name: str, body: str = "") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(f"#!/bin/sh\n{body or f'echo {name} 9.8.7; echo second line'}\n")
    path.chmod(0o755)
    return path


def _policy(tmp_path: Path, text: str, *, roots: str = "") -> Policy:
    config = tmp_path / "config"
    config.mkdir(exist_ok=True)
    path = config / "policy.toml"
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    path.write_text(f"allowed_roots = [{json.dumps(roots or str(work))}]\n{text}")
    path.chmod(0o600)
    return Policy(path, state_dir=tmp_path / "state", home=tmp_path / "home")


def _request(tmp_path: Path, name: str = "qwen", **fields: object) -> RunHarness:
    fields.setdefault("cwd", str(tmp_path / "work"))
    fields.setdefault("prompt", "fix the bug\nin widgets")
    return RunHarness(harness=name, **fields)  # type: ignore[arg-type]


def _all(tmp_path: Path, extra: str = "") -> tuple[Policy, dict[str, Path]]:
    bin_dir = tmp_path / "bin"
    programs = {n: _program(bin_dir, n) for n in ("qwen", "codex", "claude")}
    text = '[harness]\nallowed = ["qwen", "codex", "claude"]\n'
    for name, program in programs.items():
        text += f"[harness.{name}]\nprogram = {json.dumps(str(program))}\n"
        text += extra.replace("NAME", name)
    return _policy(tmp_path, text), programs


# ---------------------------------------------------------------------------- building


def test_qwen_run_takes_model_endpoint_key_and_the_smaller_turn_limit(tmp_path: Path) -> None:
    program = _program(tmp_path / "bin", "qwen")
    policy = _policy(
        tmp_path,
        '[harness]\nallowed = ["qwen"]\n[harness.qwen]\n'
        f"program = {json.dumps(str(program))}\n"
        'model = "qwen3-coder-plus"\nbase_url = "https://llm.example.com/v1"\n'
        'credential = "qwen-key"\nmax_turns = 20\n',
    )
    built = runs.build(_request(tmp_path, max_turns=50, resume_session="abc-123"), policy)
    assert list(built.argv) == [
        str(program),
        "--safe-mode",
        "--output-format",
        "stream-json",
        "--approval-mode",
        "yolo",
        "--auth-type",
        "openai",
        "--model",
        "qwen3-coder-plus",
        "--openai-base-url",
        "https://llm.example.com/v1",
        "--max-session-turns",
        "20",
        "--resume",
        "abc-123",
    ]
    assert built.stdin == b"fix the bug\nin widgets"  # the prompt: stdin, never argv
    assert not any("fix the bug" in a for a in built.argv)
    assert built.env == {"QWEN_CODE_SUPPRESS_YOLO_WARNING": "1"}
    assert built.credential == "qwen-key"
    assert runs.credential_ref("qwen", policy) == CredentialRef(
        "qwen-key", Delivery.ENV, "OPENAI_API_KEY"
    )
    # The request's own, smaller limit wins; none asked: the policy's cap.
    assert "5" in runs.build(_request(tmp_path, max_turns=5), policy).argv
    assert "20" in runs.build(_request(tmp_path), policy).argv


def test_qwen_without_settings_uses_its_own_and_no_limit(tmp_path: Path) -> None:
    program = _program(tmp_path / "bin", "qwen")
    policy = _policy(tmp_path, '[harness]\ndefault = "qwen"\n')  # the default is allowed
    built = runs.build(_request(tmp_path), policy, path_var=str(program.parent))
    assert list(built.argv) == [
        str(program),
        "--safe-mode",
        "--output-format",
        "stream-json",
        "--approval-mode",
        "yolo",
    ]
    assert built.credential == ""
    assert runs.credential_ref("qwen", policy) is None


def test_codex_and_claude_command_lines(tmp_path: Path) -> None:
    policy, programs = _all(tmp_path, 'model = "m1"\ncredential = "NAME-key"\nmax_turns = 7\n')
    codex = runs.build(_request(tmp_path, "codex", resume_session="0199-aa"), policy)
    assert list(codex.argv) == [
        str(programs["codex"]),
        "exec",
        "--json",
        "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox",
        "--model",
        "m1",
        "resume",
        "0199-aa",
        "-",
    ]
    claude = runs.build(_request(tmp_path, "claude", resume_session="s1", max_turns=9), policy)
    assert list(claude.argv) == [
        str(programs["claude"]),
        "--print",
        "--output-format",
        "stream-json",
        "--verbose",
        "--permission-mode",
        "bypassPermissions",
        "--model",
        "m1",
        "--max-turns",
        "7",
        "--resume",
        "s1",
    ]
    assert runs.credential_ref("codex", policy) == CredentialRef(
        "codex-key", Delivery.ENV, "CODEX_API_KEY"
    )
    assert runs.credential_ref("claude", policy) == CredentialRef(
        "claude-key", Delivery.ENV, "ANTHROPIC_API_KEY"
    )
    new = runs.build(_request(tmp_path, "codex"), policy)
    assert new.argv[-1] == "-"
    assert "resume" not in new.argv


def test_codex_base_url_is_a_config_override(tmp_path: Path) -> None:
    policy, _ = _all(tmp_path)
    text = policy.path.read_text().replace(
        "[harness.codex]\n", '[harness.codex]\nbase_url = "http://127.0.0.1:8080/v1"\n'
    )
    policy.path.write_text(text)
    built = runs.build(_request(tmp_path, "codex"), policy)
    assert list(built.argv[5:7]) == ["-c", 'openai_base_url="http://127.0.0.1:8080/v1"']


@pytest.mark.parametrize(
    ("fields", "reason", "words"),
    [
        ({"harness": "bash"}, Reason.POLICY_DENIED, "unknown harness 'bash'"),
        ({"harness": "codex"}, Reason.POLICY_DENIED, '[harness] allowed = ["qwen", "codex"]'),
        ({"prompt": "  "}, Reason.INVALID, "prompt is required"),
        ({"cwd": "work"}, Reason.INVALID, "absolute path"),
        ({"cwd": ""}, Reason.INVALID, "cwd is required"),
        ({"resume_session": "--yolo"}, Reason.INVALID, "session id"),
        ({"resume_session": "a b"}, Reason.INVALID, "session id"),
    ],
)
def test_requests_that_cannot_run_are_refused_with_the_fix(
    tmp_path: Path, fields: dict[str, object], reason: Reason, words: str
) -> None:
    program = _program(tmp_path / "bin", "qwen")
    policy = _policy(
        tmp_path,
        f'[harness]\nallowed = ["qwen"]\n[harness.qwen]\nprogram = {json.dumps(str(program))}\n',
    )
    fields = {"harness": "qwen", "cwd": str(tmp_path / "work"), "prompt": "hi", **fields}
    with pytest.raises(runs.HarnessRefused) as caught:
        runs.build(RunHarness(**fields), policy)  # type: ignore[arg-type]
    assert caught.value.reason == reason
    assert words in caught.value.message


def test_a_harness_that_is_not_installed_says_how_to_install_it(tmp_path: Path) -> None:
    policy = _policy(
        tmp_path,
        '[harness]\nallowed = ["codex", "qwen"]\n[harness.qwen]\nprogram = "/nonexistent/qwen"\n',
    )
    with pytest.raises(runs.HarnessRefused, match="npm install -g @openai/codex"):
        runs.build(_request(tmp_path, "codex"), policy, path_var=str(tmp_path / "empty"))
    with pytest.raises(runs.HarnessRefused, match="is not an executable file"):
        runs.build(_request(tmp_path, "qwen"), policy)


# ---------------------------------------------------------------------------- policy


def test_an_http_delivered_harness_key_goes_through_the_proxy_and_a_placeholder_stays(
    tmp_path: Path,
) -> None:
    program = _program(tmp_path / "bin", "qwen")
    policy = _policy(
        tmp_path,
        '[harness]\nallowed = ["qwen"]\n[harness.qwen]\n'
        f'program = {json.dumps(str(program))}\ncredential = "qwen-key"\ndelivery = "http"\n'
        '[credentials.qwen-key]\nallow = []\nhosts = ["llm.example.com"]\n',
    )
    ref = runs.credential_ref("qwen", policy)
    assert ref is not None
    assert (ref.name, ref.delivery, ref.env_var) == ("qwen-key", Delivery.HTTP, "")
    built = runs.build(_request(tmp_path), policy)
    assert built.env["OPENAI_API_KEY"] == runs.PLACEHOLDER_KEY
    assert "--auth-type" in built.argv


def test_the_harness_credential_needs_no_scope_but_others_do(tmp_path: Path) -> None:
    program = _program(tmp_path / "bin", "qwen")
    policy = _policy(
        tmp_path,
        '[harness]\nallowed = ["qwen"]\n[harness.qwen]\n'
        f'program = {json.dumps(str(program))}\ncredential = "qwen-key"\n',
    )
    built = runs.build(_request(tmp_path), policy)
    ref = runs.credential_ref("qwen", policy)
    assert ref is not None
    command = Command(command_id="cmd_1", op=built, credentials=(ref,))
    assert policy.check(command).action == "allow"
    # Another credential on the same run is judged as on any exec: it has no scope here.
    other = CredentialRef("github-token", Delivery.ENV, "GH_TOKEN")
    decision = policy.check(Command(command_id="cmd_1", op=built, credentials=(ref, other)))
    assert decision.action == "deny"
    assert decision.rule == "credentials.github-token.allow"
    # The same key named on a plain exec of the same program is not implicitly scoped.
    plain = Command(
        command_id="cmd_2",
        op=HarnessExec(argv=built.argv, cwd=built.cwd),
        credentials=(ref,),
    )
    assert policy.check(plain).action == "deny"
    # An unbuilt request never passes.
    raw = Command(command_id="cmd_3", op=_request(tmp_path))
    assert policy.check(raw).action == "deny"


# ---------------------------------------------------------------------------- detection


def test_detection_finds_programs_versions_and_logins(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True)
    (home / ".codex" / "auth.json").write_text("{}")
    (home / ".qwen").mkdir()
    bin_dir = tmp_path / "bin"
    _program(bin_dir, "codex", 'echo "codex-cli 0.50.0"; echo more')
    _program(bin_dir, "claude", "exit 3")  # installed, but says nothing useful
    rules = parse_policy(
        '[harness]\ndefault = "codex"\nallowed = ["claude"]\n[harness.qwen]\n'
        'credential = "qwen-key"\n[env]\npass = ["ANTHROPIC_API_KEY"]\n',
        Path("/p"),
        home,
    )
    environ = {"PATH": str(bin_dir), "HOME": str(home), "ANTHROPIC_API_KEY": "x" * 20}
    # The fake programs live in a temporary directory: trusted here, for the test's sake.
    found = {
        f.name: f for f in detect.detect(rules, home=home, environ=environ, untrusted=lambda _: "")
    }
    assert found["qwen"].program is None
    assert found["qwen"].version == ""
    assert not found["qwen"].logged_in  # its credential is not stored
    assert found["codex"].program == str(bin_dir / "codex")
    assert found["codex"].version == "codex-cli 0.50.0"
    assert (found["codex"].login, found["codex"].allowed, found["codex"].default) == (
        "~/.codex/auth.json",
        True,
        True,
    )
    assert found["claude"].version == ""
    assert (found["claude"].login, found["claude"].allowed) == ("$ANTHROPIC_API_KEY", True)
    assert found["codex"].report() == Harness("codex", "codex-cli 0.50.0", True, True)

    # The stored credential; a key in qwen's settings; a key the daemon has but does not pass.
    found = {
        f.name: f for f in detect.detect(rules, home=home, environ=environ, stored=["qwen-key"])
    }
    assert found["qwen"].login == "credential qwen-key"
    (home / ".qwen" / "settings.json").write_text(
        json.dumps({"security": {"auth": {"apiKey": "sk-" + "z" * 20}}})
    )
    no_cred = parse_policy("", Path("/p"), home)
    found = {f.name: f for f in detect.detect(no_cred, home=home, environ=environ)}
    assert found["qwen"].login == "~/.qwen/settings.json"
    assert not found["claude"].logged_in  # ANTHROPIC_API_KEY is not in [env] pass here
    assert not any(f.allowed for f in found.values())
    # A broken policy allows nothing.
    assert not any(f.allowed for f in detect.detect(None, home=home, environ=environ))


def test_a_version_that_hangs_is_given_up(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(detect, "VERSION_TIMEOUT_SECONDS", 0.5)
    program = _program(tmp_path / "bin", "qwen", "sleep 30 & sleep 30")
    assert detect.version_of(str(program), {"PATH": os.environ["PATH"]}) == ""


# ---------------------------------------------------------------------------- wire, approvals


def test_wire_carries_run_harness_and_the_harness_report() -> None:
    message = pb.Command(
        command_id="cmd_1",
        run_harness=pb.RunHarness(
            harness="qwen",
            cwd="/w",
            prompt="p",
            resume_session="s",
            max_turns=3,
            timeout_seconds=60,
        ),
    )
    decoded = wire.decode_command(message.SerializeToString())
    assert decoded.op == RunHarness("qwen", "/w", "p", "s", 3, 60)
    assert decoded.kind == "run_harness"
    out = wire.repositories(
        [Repository("/r", "github.com/a/b", "main")],
        truncated=False,
        scanned_at=1.0,
        harnesses=[Harness("qwen", "0.24.4", True, False)],
        default_harness="qwen",
    )
    report = out.repositories
    assert [(h.name, h.version, h.allowed, h.logged_in) for h in report.harnesses] == [
        ("qwen", "0.24.4", True, False)
    ]
    assert report.default_harness == "qwen"


def test_an_approval_shows_the_harness_and_the_prompts_first_line_redacted() -> None:
    request = RunHarness("qwen", "/w", "\n  deploy with key SECRET-123\nsecond line", "s1")
    command = Command(
        command_id="cmd_1",
        op=HarnessExec(argv=("/bin/qwen", "--safe-mode"), cwd="/w", request=request),
    )
    line = summarize(command)
    assert line.startswith('run_harness qwen: "deploy with key SECRET-123" resuming session s1')
    details = describe(command, lambda t: t.replace("SECRET-123", "********"))
    assert details["kind"] == "exec"
    assert (details["harness"], details["prompt"]) == ("qwen", "deploy with key ********")
    assert details["argv"] == ["/bin/qwen", "--safe-mode"]


# ---------------------------------------------------------------------------- CLI


def test_harness_list_shows_each_and_how_to_fix_what_is_missing(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.mkdir(mode=0o700)
    bin_dir = tmp_path / "bin"
    _program(bin_dir, "qwen", "echo 0.24.4")
    bin_dir.chmod(0o777)  # a directory others may write
    policy = config / "policy.toml"
    policy.write_text('allowed_roots = []\n[harness]\ndefault = "qwen"\n')
    policy.chmod(0o600)
    env = {
        **os.environ,
        "ENDPOINTD_CONFIG_DIR": str(config),
        "ENDPOINTD_STATE_DIR": str(tmp_path / "state"),
        "HOME": str(tmp_path / "home"),
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PYTHON_KEYRING_BACKEND": "keyring.backends.fail.Keyring",
    }
    for var in ("OPENAI_API_KEY", "CODEX_API_KEY", "ANTHROPIC_API_KEY"):
        env.pop(var, None)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "endpointd", "harness", *args],
            env=env,
            cwd=tempfile.gettempdir(),
            capture_output=True,
            text=True,
            timeout=60,
        )

    shown = run("list")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].split() == [
        "NAME",
        "VERSION",
        "INSTALLED",
        "LOGGED",
        "IN",
        "ALLOWED",
        "DEFAULT",
    ]
    # Installed, but in a directory others may write: its --version, which would run
    # outside any sandbox, is not asked.
    assert lines[1].split() == ["qwen", "-", str(bin_dir / "qwen"), "no", "yes", "yes"]
    assert lines[2].split()[:3] == ["codex", "-", "no"]
    assert "`npm install -g @openai/codex`" in shown.stdout
    assert "`npm install -g @anthropic-ai/claude-code`" in shown.stdout
    assert '[harness] allowed = ["codex"]' in shown.stdout
    assert "`endpointd creds add qwen-key`" in shown.stdout
    assert '[harness.qwen] credential = "qwen-key"' in shown.stdout

    as_json = run("list", "--json")
    assert as_json.returncode == 0, as_json.stderr
    rows = {r["name"]: r for r in json.loads(as_json.stdout)}
    assert rows["qwen"]["installed"]
    assert rows["qwen"]["default"]
    assert rows["qwen"]["allowed"]
    assert not rows["claude"]["installed"]
    assert rows["claude"]["path"] is None

    helped = run("--help")
    assert helped.returncode == 0
    assert "allowed = " in helped.stdout
    assert "credential" in helped.stdout
