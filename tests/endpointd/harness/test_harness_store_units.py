"""A harness run's session store (endpointd.harness.stores) and what the sandbox makes of
it, unit by unit: where a store is, what a resume may reach, the login links, retention
and removal; the read-only login grant in the Landlock spec and the Seatbelt profile; the
owner's harness state among the built-in denied paths. The whole, through the real daemon
and sandbox, is test_harness_stores.py."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from endpointd.guard import landlock, sandbox, seatbelt
from endpointd.guard.policy import Policy
from endpointd.harness import detect, stores
from endpointd.harness.logins import login_secrets
from endpointd.rules.errors import PolicyError
from endpointd.rules.parser import parse_policy
from endpointd.rules.tables import DEFAULT_DENIED_PATHS
from superagent_shared.messages import Reason
from tests.endpointd.guard.test_seatbelt import HOME, confinement, rule_paths, rules, writes


def _home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    for relative, text in {
        ".claude/.credentials.json": '{"claudeAiOauth": {}}',
        ".codex/auth.json": "{}",
        ".qwen/oauth_creds.json": "{}",
        ".qwen/settings.json": "{}",
    }.items():
        (home / relative).parent.mkdir(parents=True, exist_ok=True)
        (home / relative).write_text(text)
    return home


def _open(tmp_path: Path, harness: str, command: str, **kw: object) -> stores.RunStore:
    kw.setdefault("cwd", str(tmp_path / "work"))
    (tmp_path / "work").mkdir(exist_ok=True)
    return stores.open_for_run(
        tmp_path / "state",
        harness=harness,
        home=tmp_path / "home",
        command_id=command,
        **kw,  # type: ignore[arg-type]
    )


def test_each_run_gets_a_private_store_its_harness_is_pointed_at(tmp_path: Path) -> None:
    home = _home(tmp_path)
    claude = _open(tmp_path, "claude", "cmd_1")
    codex = _open(tmp_path, "codex", "cmd_2")
    qwen = _open(tmp_path, "qwen", "cmd_3")
    again = _open(tmp_path, "claude", "cmd_4")
    paths = {s.path for s in (claude, codex, qwen, again)}
    assert len(paths) == 4
    root = tmp_path / "state" / stores.STORES_DIR
    for store in (claude, codex, qwen):
        assert store.path.parent.parent == root  # in the daemon's (denied) state dir
        assert stat.S_IMODE(store.path.stat().st_mode) == 0o700
        assert stat.S_IMODE(store.path.parent.stat().st_mode) == 0o700
    assert claude.env == {"CLAUDE_CONFIG_DIR": str(claude.path)}
    assert codex.env == {"CODEX_HOME": str(codex.path), "CODEX_SQLITE_HOME": str(codex.path)}
    assert qwen.env == {"QWEN_HOME": str(qwen.path), "QWEN_RUNTIME_DIR": str(qwen.path)}
    # The login: a link to the owner's file (no copy), and the one file the run may read.
    link = claude.path / ".credentials.json"
    assert link.is_symlink()
    assert os.readlink(link) == str(home / ".claude/.credentials.json")
    assert claude.logins == (str(home / ".claude/.credentials.json"),)
    assert codex.logins == (str(home / ".codex/auth.json"),)
    assert set(qwen.logins) == {
        str(home / ".qwen/oauth_creds.json"),
        str(home / ".qwen/settings.json"),
    }
    # The same command built again (a restart) keeps its store.
    assert _open(tmp_path, "claude", "cmd_1").path == claude.path


def test_a_login_outside_its_harness_directory_is_not_linked(tmp_path: Path) -> None:
    home = _home(tmp_path)
    secret = tmp_path / "elsewhere" / "id_rsa"
    secret.parent.mkdir()
    secret.write_text("key")
    (home / ".codex/auth.json").unlink()
    (home / ".codex/auth.json").symlink_to(secret)
    store = _open(tmp_path, "codex", "cmd_1")
    assert store.logins == ()
    assert not os.path.lexists(store.path / "auth.json")
    # No login at all: nothing linked, nothing granted.
    (home / ".claude/.credentials.json").unlink()
    assert _open(tmp_path, "claude", "cmd_2").logins == ()


def test_what_a_run_left_under_a_login_name_is_replaced_before_the_next(tmp_path: Path) -> None:
    home = _home(tmp_path)
    store = _open(tmp_path, "claude", "cmd_1")
    (store.path / "projects" / "-w").mkdir(parents=True)
    (store.path / "projects" / "-w" / "s1.jsonl").write_text("{}")
    # The run swaps its login for one of its choosing, or a directory.
    (store.path / ".credentials.json").unlink()
    (store.path / ".credentials.json").write_text('{"attacker": 1}')
    stores.finish(tmp_path / "state", "cmd_1", keep_hours=1)
    resumed = _open(tmp_path, "claude", "cmd_2", resume_session="s1")
    assert resumed.path == store.path
    assert os.readlink(store.path / ".credentials.json") == str(home / ".claude/.credentials.json")
    (store.path / ".credentials.json").unlink()
    (store.path / ".credentials.json").mkdir()
    (store.path / ".credentials.json" / "x").write_text("")
    _open(tmp_path, "claude", "cmd_3", resume_session="s1")
    assert (store.path / ".credentials.json").is_symlink()


def test_a_resume_reaches_only_the_store_holding_that_session_for_that_project(
    tmp_path: Path,
) -> None:
    _home(tmp_path)
    state = tmp_path / "state"
    claude = _open(tmp_path, "claude", "cmd_1")
    (claude.path / "projects" / "-work").mkdir(parents=True)
    (claude.path / "projects" / "-work" / "abc-1.jsonl").write_text("{}")
    codex = _open(tmp_path, "codex", "cmd_2")
    day = codex.path / "sessions" / "2026" / "12" / "07"
    day.mkdir(parents=True)
    (day / "rollout-2026-12-07T10-00-00-0199-aa.jsonl").write_text("{}")
    # A link named like a session is not one (and is never followed).
    (claude.path / "projects" / "-work" / "linked.jsonl").symlink_to("/etc/passwd")
    for command in ("cmd_1", "cmd_2"):
        stores.finish(state, command, keep_hours=1)

    assert _open(tmp_path, "claude", "cmd_3", resume_session="abc-1").path == claude.path
    assert _open(tmp_path, "codex", "cmd_4", resume_session="0199-aa").path == codex.path
    other = tmp_path / "other"
    other.mkdir()
    refused = [
        ("claude", {"resume_session": "abc-1", "cwd": str(other)}),  # another project
        ("codex", {"resume_session": "abc-1"}),  # another harness
        ("claude", {"resume_session": "linked"}),  # a link, not a session file
        ("claude", {"resume_session": "nope"}),
    ]
    for harness, fields in refused:
        with pytest.raises(stores.StoreRefused) as caught:
            _open(tmp_path, harness, "cmd_9", **fields)
        assert caught.value.reason == Reason.INVALID
        assert repr(fields["resume_session"]) in caught.value.message


def test_stores_are_kept_as_the_policy_says_and_then_removed(tmp_path: Path) -> None:
    _home(tmp_path)
    state = tmp_path / "state"
    now = 1_000_000.0
    kept = _open(tmp_path, "claude", "cmd_1", now=now)
    gone = _open(tmp_path, "claude", "cmd_2", now=now)
    running = _open(tmp_path, "claude", "cmd_3", now=now)
    stores.finish(state, "cmd_1", keep_hours=2, now=now)
    stores.finish(state, "cmd_2", keep_hours=0, now=now)  # 0: goes when the run ends
    assert kept.path.exists()
    assert not gone.path.parent.exists()
    # An hour on: kept (and the running one too); three hours on: the idle one goes.
    assert stores.sweep(state, keep_hours=2, max_run_seconds=3600 * 4, now=now + 3600) == []
    assert stores.sweep(state, keep_hours=2, max_run_seconds=3600 * 4, now=now + 3 * 3600) == [
        kept.path.parent.name
    ]
    assert running.path.exists()
    # A run recorded as running for longer than any run may last is gone.
    assert stores.sweep(state, keep_hours=2, max_run_seconds=3600, now=now + 4 * 3600) == [
        running.path.parent.name
    ]
    # A store whose project directory was removed goes at once.
    project = tmp_path / "ticket"
    project.mkdir()
    orphan = _open(tmp_path, "qwen", "cmd_4", cwd=str(project), now=now)
    project.rmdir()
    assert stores.sweep(state, keep_hours=2, max_run_seconds=60, now=now) == [
        orphan.path.parent.name
    ]


def test_removal_never_follows_a_link_a_run_planted(tmp_path: Path) -> None:
    _home(tmp_path)
    outside = tmp_path / "outside"
    (outside / "keep").mkdir(parents=True)
    (outside / "keep" / "file").write_text("mine")
    outside.chmod(0o755)
    store = _open(tmp_path, "claude", "cmd_1")
    (store.path / "link").symlink_to(outside)
    (store.path / "locked" / "deep").mkdir(parents=True)
    (store.path / "locked" / "deep" / "f").write_text("")
    (store.path / "locked" / "deep").chmod(0)
    (store.path / "locked").chmod(0o500)
    stores.finish(tmp_path / "state", "cmd_1", keep_hours=0)
    assert not store.path.parent.exists()
    assert (outside / "keep" / "file").read_text() == "mine"
    assert stat.S_IMODE(outside.stat().st_mode) == 0o755


def test_the_sandbox_grants_the_store_and_reads_the_login_only(tmp_path: Path) -> None:
    home = _home(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    state = tmp_path / "state"
    rules_ = parse_policy(f'allowed_roots = ["{work}"]\n', Path("/p"), home)
    store = _open(tmp_path, "claude", "cmd_1")
    tmp = state / "spool" / "cmd_1" / "tmp"
    tmp.mkdir(parents=True)
    login = str(home / ".claude/.credentials.json")
    c = sandbox.plan(
        rules_,
        denied=[str(home / ".claude"), str(state)],
        workspace=str(work),
        tmpdir=str(tmp),
        own_write=[str(store.path)],
        extra_write=[str(state / "elsewhere")],  # inside a denied path: never granted
        read_files=[login],
    )
    assert str(store.path) in c.write
    assert str(state / "elsewhere") not in c.write
    assert c.read_files == (login,)
    if c.mechanism == "landlock":
        grants = sandbox.landlock_spec(c)["grants"]
        assert isinstance(grants, list)
        assert (login, landlock.READ_FILE) in grants
        assert not [g for g in grants if g[0] == login and g[1] != landlock.READ_FILE]


def test_the_seatbelt_profile_reopens_the_login_for_reading_only() -> None:
    login = f"{HOME}/.claude/.credentials.json"
    c = confinement(denied=(f"{HOME}/.claude",), read_files=(login,))
    found = rules(seatbelt.profile(c))
    denial = next(r for r in found if r.action == "deny" and f"{HOME}/.claude" in rule_paths(r))
    reopened = [r for r in found if r.action == "allow" and login in rule_paths(r)]
    assert [r.ops for r in reopened] == [("file-read*",)]
    assert reopened[0].index > denial.index  # the last matching rule wins
    assert not [r for r in found if r.action == "allow" and writes(r) and login in rule_paths(r)]


def test_every_harness_state_is_denied_to_every_command(tmp_path: Path) -> None:
    for entry in ("~/.claude", "~/.claude.json", "~/.codex", "~/.qwen"):
        assert entry in DEFAULT_DENIED_PATHS
    config = tmp_path / "config"
    config.mkdir()
    (config / "policy.toml").write_text(f'allowed_roots = ["{tmp_path}"]\n')
    (config / "policy.toml").chmod(0o600)
    policy = Policy(config / "policy.toml", state_dir=tmp_path / "state", home=tmp_path)
    for path in (".claude/.credentials.json", ".codex/auth.json", ".qwen/oauth_creds.json"):
        decision = policy.check_path(str(tmp_path / path), "read")
        assert decision.action == "deny", path


def test_keep_sessions_hours_is_read_and_checked() -> None:
    home = Path("/home/u")
    assert parse_policy("", Path("/p"), home).harness.keep_sessions_hours == 72
    rules_ = parse_policy("[harness]\nkeep_sessions_hours = 0\n", Path("/p"), home)
    assert rules_.harness.keep_sessions_hours == 0
    for bad in ("-1", '"72"', "1.5", "true"):
        with pytest.raises(PolicyError, match="keep_sessions_hours"):
            parse_policy(f"[harness]\nkeep_sessions_hours = {bad}\n", Path("/p"), home)


def test_a_harness_state_the_owner_moved_is_denied_and_its_login_is_linked_from_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = _home(tmp_path)
    moved = tmp_path / "profiles" / "claude-work"
    moved.mkdir(parents=True)
    (moved / ".credentials.json").write_text("{}")
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(moved))
    store = _open(tmp_path, "claude", "cmd_1")
    assert store.logins == (str(moved / ".credentials.json"),)
    assert store.env == {"CLAUDE_CONFIG_DIR": str(store.path)}  # never the owner's
    config = tmp_path / "config"
    config.mkdir()
    (config / "policy.toml").write_text(f'allowed_roots = ["{tmp_path}"]\n')
    (config / "policy.toml").chmod(0o600)
    policy = Policy(config / "policy.toml", state_dir=tmp_path / "state", home=home)
    decision = policy.check_path(str(moved / "projects" / "x.jsonl"), "read")
    assert (decision.action, decision.rule) == ("deny", "denied_paths: $CLAUDE_CONFIG_DIR")


def test_the_secrets_of_the_owners_logins_are_known_to_the_redactor(tmp_path: Path) -> None:
    home = tmp_path / "home"
    files = {
        ".claude/.credentials.json": {
            "claudeAiOauth": {"accessToken": "sk-ant-oat01-aaaa", "expiresAt": 1799999999999}
        },
        ".codex/auth.json": {
            "OPENAI_API_KEY": None,
            "tokens": {"id_token": "eyJhbGciOi.x", "account_id": "acct-1234567890"},
        },
        ".qwen/oauth_creds.json": {"access_token": "qwen-access-1", "token_type": "Bearer"},
        ".qwen/settings.json": {"security": {"auth": {"apiKey": "sk-qwen-settings"}}},
    }
    for relative, data in files.items():
        (home / relative).parent.mkdir(parents=True, exist_ok=True)
        (home / relative).write_text(json.dumps(data))
    found = set(login_secrets(home, {}).values())
    assert found == {b"sk-ant-oat01-aaaa", b"eyJhbGciOi.x", b"qwen-access-1", b"sk-qwen-settings"}
    # Read again when a file changes; a broken file gives nothing, and no error.
    (home / ".codex/auth.json").write_text('{"tokens": {"refresh_token": "rt-new-value-1"}}')
    (home / ".qwen/settings.json").write_text("{not json")
    found = set(login_secrets(home, {}).values())
    assert found == {b"sk-ant-oat01-aaaa", b"rt-new-value-1", b"qwen-access-1"}


def test_a_harness_variable_naming_the_home_directory_denies_only_its_subdirectories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = _home(tmp_path)
    runtime = tmp_path / "runtime" / "qwen"
    monkeypatch.setenv("QWEN_HOME", str(home))  # a mistake: never deny the whole home
    monkeypatch.setenv("QWEN_RUNTIME_DIR", str(runtime))
    config = tmp_path / "config"
    config.mkdir()
    (config / "policy.toml").write_text(f'allowed_roots = ["{tmp_path}"]\n')
    (config / "policy.toml").chmod(0o600)
    policy = Policy(config / "policy.toml", state_dir=tmp_path / "state", home=home)
    assert policy.check_path(str(home / "notes.txt"), "read").action == "allow"
    decision = policy.check_path(str(runtime / "projects" / "x"), "read")
    assert (decision.action, decision.rule) == ("deny", "denied_paths: $QWEN_RUNTIME_DIR")


def test_detection_looks_for_a_login_where_the_owner_moved_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    moved = tmp_path / "codex-home"
    moved.mkdir()
    rules_ = parse_policy("", Path("/p"), home)
    environ = {"CODEX_HOME": str(moved)}
    settings = rules_.harness.settings_for("codex")
    args = {"home": home, "environ": environ, "passed": (), "stored": ()}
    assert detect.login_of("codex", settings, **args) == ""  # type: ignore[arg-type]
    (moved / "auth.json").write_text("{}")
    assert detect.login_of("codex", settings, **args) == str(moved / "auth.json")  # type: ignore[arg-type]
