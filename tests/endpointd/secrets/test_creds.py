"""`endpointd creds`: values in the keyring only, from a hidden prompt or stdin, never shown.

Every CLI run is a real subprocess with its config and state dirs in tmp_path and a real
file-based keyring backend (keyrings.alt's PlaintextKeyring, its data dir in tmp_path
through XDG_DATA_HOME), so the tests can look at every file endpointd wrote and check that
the secret is in none of them.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from endpointd.secrets.store import CredentialError, validate_value
from tests.support.cli_output import in_a_terminal, one_line_error, read_until

PLAINTEXT_KEYRING = "keyrings.alt.file.PlaintextKeyring"


class Device:
    def __init__(self, tmp_path: Path) -> None:
        self.config = tmp_path / "config"
        self.state = tmp_path / "state"
        self.keyring_data = tmp_path / "keyring-data"
        self.home = tmp_path / "home"
        self.home.mkdir()
        self.env = {
            **os.environ,
            "ENDPOINTD_CONFIG_DIR": str(self.config),
            "ENDPOINTD_STATE_DIR": str(self.state),
            "PYTHON_KEYRING_BACKEND": PLAINTEXT_KEYRING,
            "XDG_DATA_HOME": str(self.keyring_data),
            "HOME": str(self.home),
        }

    def cli(
        self, *args: str, stdin: bytes | None = b"", env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [sys.executable, "-m", "endpointd", *args],
            cwd=tempfile.gettempdir(),
            env={**self.env, **(env or {})},
            input=stdin,
            stdin=subprocess.DEVNULL if stdin is None else None,
            capture_output=True,
            timeout=60,
        )
        return subprocess.CompletedProcess(
            proc.args, proc.returncode, proc.stdout.decode(), proc.stderr.decode()
        )

    def python(self, code: str) -> str:
        """Run ``code`` with the CredentialStore of this device's config dir as ``store``."""
        prelude = (
            "import sys, json; from pathlib import Path;"
            " from endpointd.secrets.store import CredentialStore;"
            f" store = CredentialStore(Path({str(self.config)!r}));"
        )
        proc = subprocess.run(
            [sys.executable, "-c", prelude + code],
            cwd=tempfile.gettempdir(),
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    def files(self, *roots: Path) -> list[Path]:
        return [p for root in roots if root.exists() for p in root.rglob("*") if p.is_file()]


@pytest.fixture
def device(tmp_path: Path) -> Device:
    return Device(tmp_path)


def _value() -> str:
    # Random, so an occurrence anywhere can only come from this test.
    return "canary-" + secrets.token_urlsafe(24)


def _forms(value: str) -> list[bytes]:
    raw = value.encode()
    return [raw, base64.b64encode(raw), base64.urlsafe_b64encode(raw)]


def test_add_from_stdin_list_touch_and_remove(device: Device) -> None:
    value = _value()
    device.config.mkdir(mode=0o700)
    (device.config / "policy.toml").write_text(
        f'allowed_roots = ["{device.home}"]\n\n[credentials.github-token]\nallow = ["git *"]\n'
    )
    (device.config / "policy.toml").chmod(0o600)

    added = device.cli("creds", "add", "github-token", stdin=(value + "\n").encode())
    assert added.returncode == 0, added.stderr
    assert "stored credential github-token" in added.stdout
    assert "no command may receive it" not in added.stdout  # it has a scope
    other = device.cli("creds", "add", "npm-token", stdin=_value().encode())
    assert "add [credentials.npm-token] with" in other.stdout

    # The value went to the keyring intact (one trailing newline removed).
    assert device.python("print(store.get('github-token').decode())") == value + "\n"
    assert json.loads(device.python("print(json.dumps(sorted(store.values())))")) == [
        "github-token",
        "npm-token",
    ]

    listed = device.cli("creds", "list")
    assert listed.returncode == 0, listed.stderr
    assert "github-token\n  scope: git *\n  added " in listed.stdout
    assert "last used never" in listed.stdout
    assert "npm-token\n  scope: none: not delivered to any command" in listed.stdout
    as_json = device.cli("creds", "list", "--json")
    rows = {row["name"]: row for row in json.loads(as_json.stdout)}
    assert rows["github-token"]["scope"] == ["git *"]
    assert rows["github-token"]["stored"] is True
    assert rows["npm-token"]["scope"] is None
    assert rows["github-token"]["last_used_at"] is None

    device.python("store.touch('github-token')")
    rows = {row["name"]: row for row in json.loads(device.cli("creds", "list", "--json").stdout)}
    assert rows["github-token"]["last_used_at"] is not None
    assert "last used never" not in device.cli("creds", "list").stdout.split("npm-token")[0]

    # Never a value: not in any output, not in any file endpointd owns.
    outputs = [added, other, listed, as_json]
    for proc in outputs:
        assert value not in proc.stdout + proc.stderr
    files = device.files(device.config, device.state)
    assert device.config / "credentials.json" in files
    for path in files:
        data = path.read_bytes()
        for form in _forms(value):
            assert form not in data, path
    assert oct(os.stat(device.config / "credentials.json").st_mode & 0o777) == "0o600"
    # ...while the keyring backend's own storage (outside those dirs) does hold it.
    (stored,) = device.files(device.keyring_data)
    assert stored.is_relative_to(device.keyring_data)

    removed = device.cli("creds", "remove", "github-token")
    assert removed.returncode == 0, removed.stderr
    assert device.python("print(store.get('github-token'))") == "None\n"
    rows = {row["name"]: row for row in json.loads(device.cli("creds", "list", "--json").stdout)}
    # Its scope is still in the policy, so it is listed as not stored.
    assert rows["github-token"]["stored"] is False
    assert "NOT STORED" in device.cli("creds", "list").stdout
    again = device.cli("creds", "rm", "github-token")  # the old name still answers
    assert "no credential named github-token" in one_line_error(again)


def _add_in_a_terminal(device: Device, name: str, first: str, second: str) -> tuple[int, bytes]:
    deadline = time.monotonic() + 30
    with in_a_terminal(["creds", "add", name], device.env) as (proc, master):
        # getpass flushes pending input when it turns echo off: answer each prompt after it.
        shown = read_until(master, b"(hidden): ", deadline)
        os.write(master, first.encode() + b"\n")
        shown += read_until(master, b"confirm: ", deadline)
        os.write(master, second.encode() + b"\n")
        code = proc.wait(30)
        # The rest of the output; the read ends with EIO once the child has closed the pty.
        shown += read_until(master, b"\x00never", deadline)
    return code, shown


def test_a_terminal_gets_a_hidden_prompt_asked_twice(device: Device) -> None:
    value = _value()
    code, shown = _add_in_a_terminal(device, "github-token", value, value)
    assert code == 0, shown
    assert b"stored credential github-token" in shown
    assert value.encode() not in shown  # echo was off
    assert device.python("print(store.get('github-token').decode())") == value + "\n"

    code, shown = _add_in_a_terminal(device, "npm-token", value, value + "x")
    assert code == 1
    assert b"error: the two values differ; nothing stored" in shown
    assert "npm-token" not in device.cli("creds", "list").stdout


def test_without_a_terminal_the_value_must_come_on_stdin(device: Device) -> None:
    for stdin in (None, b"", b"\n"):
        proc = device.cli("creds", "add", "github-token", stdin=stdin)
        error = one_line_error(proc)
        assert "no value on stdin" in error
        assert "never taken from the command line" in error
    assert not (device.config / "credentials.json").exists()

    # There is no option or argument that takes the value.
    help_text = device.cli("creds", "add", "--help").stdout
    assert "--value" not in help_text
    extra = device.cli("creds", "add", "github-token", _value())
    assert extra.returncode == 2
    assert "unexpected extra argument" in extra.stderr.lower()


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("x7#Qz", ["shorter than 8 characters"]),
        ('{"user": "alice", "password": "hunter2hunter2"}', ["a JSON object", "split it"]),
        ('["hunter2hunter2", "swordfish-123"]', ["a JSON array"]),
        ("user: alice\npassword: hunter2hunter2\n", ["YAML", "separate credentials"]),
        ("- hunter2hunter2\n- swordfish-123\n", ["YAML"]),
        ("{user: alice, password: hunter2hunter2}", ["flow collection"]),
    ],
)
def test_short_and_structured_values_are_refused(
    device: Device, value: str, words: list[str]
) -> None:
    proc = device.cli("creds", "add", "db", stdin=value.encode())
    error = one_line_error(proc)
    for word in words:
        assert word in error
    assert value.strip() not in error
    assert device.cli("creds", "list", "--json").stdout.strip() == "[]"


@pytest.mark.parametrize(
    "value",
    [
        "ghp_" + "a" * 36,
        "user:pass-word-123",  # no space after the colon: a token, not YAML
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n"
        "-----END OPENSSH PRIVATE KEY-----\n",
        "Authorization: Bearer abcdefgh",  # one line is not a structure
    ],
)
def test_plain_values_are_accepted(value: str) -> None:
    assert validate_value("x", value.encode()) == value


def test_binary_and_nul_values_are_refused() -> None:
    with pytest.raises(CredentialError, match="not UTF-8"):
        validate_value("x", b"\xff\xfe" * 8)
    with pytest.raises(CredentialError, match="NUL"):
        validate_value("x", b"abcdefgh\x00ijk")


@pytest.mark.parametrize("name", ["GitHub", "-token", "a b", "x" * 65, "tok/en", ""])
def test_names_are_checked_before_asking_for_the_value(device: Device, name: str) -> None:
    proc = device.cli("creds", "add", "--", name, stdin=_value().encode())
    assert "invalid credential name" in one_line_error(proc)


def test_replacing_needs_replace(device: Device) -> None:
    assert device.cli("creds", "add", "tok", stdin=_value().encode()).returncode == 0
    second = _value()
    proc = device.cli("creds", "add", "tok", stdin=second.encode())
    assert "--replace" in one_line_error(proc)
    proc = device.cli("creds", "add", "tok", "--replace", stdin=second.encode())
    assert proc.returncode == 0, proc.stderr
    assert device.python("print(store.get('tok').decode())") == second + "\n"


def test_no_usable_keyring_says_how_to_fix_it(device: Device) -> None:
    fail = {"PYTHON_KEYRING_BACKEND": "keyring.backends.fail.Keyring"}
    proc = device.cli("creds", "add", "tok", stdin=_value().encode(), env=fail)
    error = one_line_error(proc)
    assert "no usable OS keyring" in error
    assert "no OS keyring backend is available" in error
    assert "gnome-keyring" in error
    assert "desktop session" in error
    # Listing reads only endpointd's files, so it works without a keyring.
    assert device.cli("creds", "list", env=fail).returncode == 0


def test_listing_survives_a_broken_policy_and_says_so(device: Device) -> None:
    assert device.cli("creds", "add", "tok", stdin=_value().encode()).returncode == 0
    (device.config / "policy.toml").write_text("allowed_roots = [\n")
    (device.config / "policy.toml").chmod(0o600)
    proc = device.cli("creds", "list")
    assert proc.returncode == 0, proc.stderr
    assert "? (the policy file is unusable)" in proc.stdout
    assert "warning:" in proc.stderr
    assert "policy.toml:1:" in proc.stderr


def test_add_and_rm_json_name_the_credential_never_its_value(device: Device) -> None:
    value = _value()
    device.config.mkdir(mode=0o700)
    (device.config / "policy.toml").write_text(
        f'allowed_roots = ["{device.home}"]\n\n[credentials.github-token]\nallow = ["git *"]\n'
    )
    (device.config / "policy.toml").chmod(0o600)

    added = device.cli("creds", "add", "github-token", "--json", stdin=value.encode())
    assert added.returncode == 0, added.stderr
    assert json.loads(added.stdout) == {
        "stored": True,
        "name": "github-token",
        "store": "keyring",
        "file": None,
        "scope": ["git *"],
    }
    for form in _forms(value):
        assert form.decode() not in added.stdout + added.stderr
    assert device.python("print(store.get('github-token').decode())") == value + "\n"

    in_file = device.cli(
        "creds", "add", "npm-token", "--store", "file", "--json", stdin=_value().encode()
    )
    assert in_file.returncode == 0, in_file.stderr
    stored = json.loads(in_file.stdout)
    assert stored["store"] == "file"
    assert stored["scope"] is None  # no command may receive it yet
    assert Path(stored["file"]).is_file()

    removed = device.cli("creds", "remove", "github-token", "--json")
    assert removed.returncode == 0, removed.stderr
    assert json.loads(removed.stdout) == {"removed": True, "name": "github-token"}
    rows = json.loads(device.cli("creds", "list", "--json").stdout)
    assert {r["name"]: r["stored"] for r in rows} == {"github-token": False, "npm-token": True}
