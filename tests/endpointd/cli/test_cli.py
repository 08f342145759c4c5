"""The endpointd command line: help, version, info, and the config-dir rules behind info."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import keyring
import pytest
from keyring.backends import chainer, fail, null

from endpointd import __version__
from endpointd.cli import keyring_status
from endpointd.paths import config_dir, state_dir
from superagent_shared.protocol import PROTOCOL_VERSION


def _endpointd(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # `python -m endpointd` runs the installed package exactly as a user would, without
    # depending on the console script being on PATH. It runs outside the checkout: `-m`
    # puts the cwd first on sys.path, and at the repo root the distribution directory
    # `endpointd/` (no __init__.py) would shadow the package as an empty namespace package.
    full_env = {**os.environ, **(env or {})}
    # keyring's fail backend is instant and identical everywhere; probing a real OS keyring
    # (D-Bus on Linux) could be slow or prompt on a developer's machine.
    full_env.setdefault("PYTHON_KEYRING_BACKEND", "keyring.backends.fail.Keyring")
    return subprocess.run(
        [sys.executable, "-m", "endpointd", *args],
        cwd=tempfile.gettempdir(),
        env=full_env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _commands(help_text: str) -> set[str]:
    section = help_text.split("Commands:", 1)[1]
    return {line.split()[0] for line in section.splitlines() if line.strip()}


def test_help_lists_commands_and_explains_the_daemon() -> None:
    proc = _endpointd("--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Usage: endpointd ")
    assert _commands(proc.stdout) == {
        "info",
        "version",
        "pair",
        "run",
        "status",
        "unpair",
        "service",
        "creds",
        "policy",
        "approvals",
        "approve",
        "deny",
        "audit",
        "workspaces",
        "harness",
        "sandbox",
        "completion",
    }
    # The security property a user most needs to know before installing it.
    assert "never listens for or accepts inbound" in " ".join(proc.stdout.split())


def test_version_prints_daemon_and_protocol_version() -> None:
    proc = _endpointd("version")
    assert proc.returncode == 0, proc.stderr
    assert f"endpointd {__version__}" in proc.stdout
    assert PROTOCOL_VERSION in proc.stdout


def test_info_json_reports_the_overridden_config_dir(tmp_path: Path) -> None:
    cfg = tmp_path / "endpointd-config"
    proc = _endpointd("info", "--json", env={"ENDPOINTD_CONFIG_DIR": str(cfg)})
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["config_dir"] == str(cfg)
    assert info["config_dir_source"] == "ENDPOINTD_CONFIG_DIR"
    assert info["config_dir_exists"] is False  # info only looks; it never creates it
    assert info["version"] == __version__
    assert info["protocol_version"] == PROTOCOL_VERSION
    assert info["keyring"]["class"] == "keyring.backends.fail.Keyring"
    assert info["keyring"]["usable"] is False


def test_info_human_output_says_what_to_do_without_a_keyring(tmp_path: Path) -> None:
    proc = _endpointd("info", env={"ENDPOINTD_CONFIG_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert str(tmp_path) in proc.stdout
    assert "NOT usable" in proc.stdout
    assert "before pairing" in proc.stdout


HOME = Path("/home/dev")


@pytest.mark.parametrize(
    ("platform", "env", "expected", "source"),
    [
        ("linux", {}, HOME / ".config/endpointd", "XDG default"),
        ("linux", {"XDG_CONFIG_HOME": "/xdg"}, Path("/xdg/endpointd"), "$XDG_CONFIG_HOME"),
        # The XDG spec: relative values are invalid and ignored.
        ("linux", {"XDG_CONFIG_HOME": "rel"}, HOME / ".config/endpointd", "XDG default"),
        ("freebsd14", {}, HOME / ".config/endpointd", "XDG default"),
        (
            "darwin",
            {"XDG_CONFIG_HOME": "/xdg"},
            HOME / "Library/Application Support/endpointd",
            "macOS default",
        ),
        ("win32", {"APPDATA": "/appdata"}, Path("/appdata/endpointd"), "%APPDATA%"),
        ("win32", {}, HOME / "AppData/Roaming/endpointd", "Windows default"),
        ("darwin", {"ENDPOINTD_CONFIG_DIR": "/cfg"}, Path("/cfg"), "ENDPOINTD_CONFIG_DIR"),
        (
            "linux",
            {"ENDPOINTD_CONFIG_DIR": "/cfg", "XDG_CONFIG_HOME": "/xdg"},
            Path("/cfg"),
            "ENDPOINTD_CONFIG_DIR",
        ),
    ],
)
def test_config_dir_follows_platform_conventions(
    platform: str, env: dict[str, str], expected: Path, source: str
) -> None:
    result = config_dir(env=env, platform=platform, home=HOME)
    assert result.path == expected
    assert result.source == source


def test_relative_override_is_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = config_dir(env={"ENDPOINTD_CONFIG_DIR": "cfg"}, platform="linux", home=HOME)
    assert result.path == tmp_path / "cfg"


class _FakeUsableKeyring:
    # Duck-typed on purpose: subclassing keyring's KeyringBackend would register the class
    # in keyring's global backend list for the rest of the test session.
    name = "Fake Keyring"


def test_keyring_status_reports_unusable_backends(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keyring, "get_keyring", fail.Keyring)
    assert keyring_status().usable is False

    monkeypatch.setattr(keyring, "get_keyring", null.Keyring)
    assert keyring_status().usable is False

    # An empty chain is what keyring builds when no backend is viable.
    monkeypatch.setattr(chainer.ChainerBackend, "backends", [])
    monkeypatch.setattr(keyring, "get_keyring", chainer.ChainerBackend)
    status = keyring_status()
    assert status.usable is False
    assert status.backend_class == "keyring.backends.chainer.ChainerBackend"


def test_keyring_status_reports_a_usable_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keyring, "get_keyring", _FakeUsableKeyring)
    status = keyring_status()
    assert status.usable is True
    assert status.backend == "Fake Keyring"


def test_keyring_status_reports_a_broken_keyring_setup(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> None:
        raise ModuleNotFoundError("No module named 'nope'")

    monkeypatch.setattr(keyring, "get_keyring", broken)
    status = keyring_status()
    assert status.usable is False
    assert "nope" in status.detail


@pytest.mark.parametrize(
    ("platform", "env", "expected", "source"),
    [
        ("linux", {}, HOME / ".local/state/endpointd", "XDG default"),
        ("linux", {"XDG_STATE_HOME": "/st"}, Path("/st/endpointd"), "$XDG_STATE_HOME"),
        ("linux", {"XDG_STATE_HOME": "rel"}, HOME / ".local/state/endpointd", "XDG default"),
        (
            "darwin",
            {},
            HOME / "Library/Application Support/endpointd/state",
            "macOS default",
        ),
        ("win32", {"LOCALAPPDATA": "/local"}, Path("/local/endpointd"), "%LOCALAPPDATA%"),
        ("linux", {"ENDPOINTD_STATE_DIR": "/s"}, Path("/s"), "ENDPOINTD_STATE_DIR"),
    ],
)
def test_state_dir_follows_platform_conventions(
    platform: str, env: dict[str, str], expected: Path, source: str
) -> None:
    result = state_dir(env=env, platform=platform, home=HOME)
    assert result.path == expected
    assert result.source == source


@pytest.mark.parametrize(
    "command",
    [
        *("pair", "run", "status", "unpair", "service"),
        *("creds", "policy", "approvals", "approve", "deny", "audit"),
    ],
)
def test_every_command_explains_itself(command: str) -> None:
    proc = _endpointd(command, "--help")
    assert proc.returncode == 0, proc.stderr
    # A summary line, then a teaching paragraph, not just a usage line.
    summary, paragraph = proc.stdout.split("\n\n")[1:3]
    assert summary.strip().endswith(".")
    assert len(paragraph.split()) >= 25


def test_status_while_a_starting_daemon_has_not_made_its_journal_yet(tmp_path: Path) -> None:
    env = {"ENDPOINTD_CONFIG_DIR": str(tmp_path / "c"), "ENDPOINTD_STATE_DIR": str(tmp_path / "s")}
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "journal.sqlite3").touch()  # created, no table yet
    proc = _endpointd("status", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["commands"] == []


def test_status_shows_the_sandbox_the_policy_chooses(tmp_path: Path) -> None:
    """Without a running daemon, `endpointd status` says how a daemon started now would
    confine commands: here not at all, as the owner chose."""
    env = {"ENDPOINTD_CONFIG_DIR": str(tmp_path / "c"), "ENDPOINTD_STATE_DIR": str(tmp_path / "s")}
    (tmp_path / "c").mkdir()
    policy = tmp_path / "c" / "policy.toml"
    policy.write_text(f'sandbox = "off"\nallowed_roots = [{json.dumps(str(tmp_path))}]\n')
    policy.chmod(0o600)
    report = json.loads(_endpointd("status", "--json", env=env).stdout)
    assert report["sandbox"] == "off (chosen in the policy); network allow"
    assert report["sandbox_from"] == "policy file"
    human = _endpointd("status", env=env).stdout
    assert "sandbox:   off (chosen in the policy); network allow (from the policy file)" in human


def test_status_and_unpair_when_not_paired(tmp_path: Path) -> None:
    env = {"ENDPOINTD_CONFIG_DIR": str(tmp_path / "c"), "ENDPOINTD_STATE_DIR": str(tmp_path / "s")}
    proc = _endpointd("status", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["paired"] is False
    assert report["daemon"]["running"] is False
    assert report["commands"] == []
    assert report["sandbox"] == "none: the policy cannot be used, so every command is refused"
    assert report["sandbox_from"] == "policy file"
    proc = _endpointd("status", env=env)
    assert "paired:    no" in proc.stdout
    assert "not running" in proc.stdout
    assert "sandbox:   none: the policy cannot be used" in proc.stdout

    proc = _endpointd("unpair", env=env)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"error: not paired (no {tmp_path / 'c' / 'config.json'}); run `endpointd pair URL CODE`"
        " first"
    ]
    proc = _endpointd("run", env=env)
    assert proc.returncode == 1
    assert "not paired" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_service_install_writes_a_systemd_user_unit(tmp_path: Path) -> None:
    target = tmp_path / "units"
    env = {
        "ENDPOINTD_SERVICE_DIR": str(target),
        "ENDPOINTD_CONFIG_DIR": str(tmp_path / "my config"),
    }
    proc = _endpointd("service", "install", env=env)
    assert proc.returncode == 0, proc.stderr
    unit = target / "endpointd.service"
    text = unit.read_text()
    assert f"ExecStart={sys.executable} -m endpointd run" in text
    assert "Restart=always" in text
    # Commands outlive the daemon by design; systemd must not kill them with it.
    assert "KillMode=process" in text
    assert f'Environment="ENDPOINTD_CONFIG_DIR={tmp_path / "my config"}"' in text
    assert "WantedBy=default.target" in text
    assert "systemctl --user enable --now endpointd" in proc.stdout

    proc = _endpointd("service", "uninstall", env=env)
    assert proc.returncode == 0, proc.stderr
    assert not unit.exists()
    proc = _endpointd("service", "uninstall", env=env)
    assert "nothing to remove" in proc.stdout


def test_launchd_agent_content(tmp_path: Path) -> None:
    import plistlib

    from endpointd.autostart import service_file

    agent = service_file("darwin", tmp_path)
    assert agent.path == tmp_path / "dev.superagent.endpointd.plist"
    plist = plistlib.loads(agent.content.encode())
    assert plist["Label"] == "dev.superagent.endpointd"
    assert plist["ProgramArguments"] == [sys.executable, "-m", "endpointd", "run"]
    assert plist["KeepAlive"] is True
    assert agent.enable == ["launchctl", "load", "-w", str(agent.path)]


def test_status_unpaired_points_at_the_daemon_superagent_up_runs(tmp_path: Path) -> None:
    """`endpointd status` once said "paired: no … not running" on a machine whose
    `superagent up --device` daemon was connected: that one lives elsewhere."""
    home = tmp_path / "home"
    env = {
        "HOME": str(home),
        "ENDPOINTD_CONFIG_DIR": str(tmp_path / "c"),
        "ENDPOINTD_STATE_DIR": str(tmp_path / "s"),
    }
    alone = _endpointd("status", env=env)
    assert "paired:    no" in alone.stdout
    assert "superagent up --device" not in alone.stdout  # none here: no hint
    device = home / ".local/share/superagent/device"
    (device / "config").mkdir(parents=True)
    (device / "config" / "config.json").write_text("{}")
    hinted = _endpointd("status", env=env)
    assert hinted.returncode == alone.returncode
    assert "`superagent up --device` runs an endpointd of its own" in hinted.stdout
    assert f"ENDPOINTD_CONFIG_DIR={device}/config ENDPOINTD_STATE_DIR={device}/state" in (
        hinted.stdout
    )
    shown = json.loads(_endpointd("status", "--json", env=env).stdout)
    assert shown["up_device"] == str(device)
