"""`endpointd creds` on a machine without an OS keyring: the explicit file store.

A headless box (SSH server, container, WSL) has no keyring. There the owner may keep
credentials in 0600 files in a 0700 directory, chosen explicitly (``--store file`` or
``credential_store = "file"`` in policy.toml), never silently. Every CLI run is a real
subprocess with keyring's fail backend (what such a machine has), its config and state dirs
in tmp_path; the attacks are a name that tries to leave the directory, loosened modes, a
foreign owner and a symlink planted where a credential file should be.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support.cli_output import one_line_error

FAIL_KEYRING = "keyring.backends.fail.Keyring"
PLAINTEXT_KEYRING = "keyrings.alt.file.PlaintextKeyring"


class Box:
    """A headless machine: endpointd's dirs in tmp_path, no usable OS keyring."""

    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path
        self.config = tmp_path / "config"
        self.state = tmp_path / "state"
        self.home = tmp_path / "home"
        self.home.mkdir()
        self.files_dir = self.config / "credentials"
        self.env = {
            **os.environ,
            "ENDPOINTD_CONFIG_DIR": str(self.config),
            "ENDPOINTD_STATE_DIR": str(self.state),
            "PYTHON_KEYRING_BACKEND": FAIL_KEYRING,
            "XDG_DATA_HOME": str(tmp_path / "keyring-data"),
            "HOME": str(self.home),
        }

    def cli(
        self, *args: str, stdin: bytes = b"", env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [sys.executable, "-m", "endpointd", *args],
            cwd=tempfile.gettempdir(),
            env={**self.env, **(env or {})},
            input=stdin,
            capture_output=True,
            timeout=60,
        )
        return subprocess.CompletedProcess(
            proc.args, proc.returncode, proc.stdout.decode(), proc.stderr.decode()
        )

    def python(self, code: str) -> subprocess.CompletedProcess[str]:
        """Run ``code`` with this box's CredentialStore as ``store``."""
        prelude = (
            "import sys, json; from pathlib import Path;"
            " from endpointd.secrets.store import CredentialStore, CredentialError;"
            f" store = CredentialStore(Path({str(self.config)!r}));"
        )
        return subprocess.run(
            [sys.executable, "-c", prelude + code],
            cwd=tempfile.gettempdir(),
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def get(self, name: str) -> str:
        """What the daemon's store reads for ``name`` ("None" when absent), or the one-line
        CredentialError it raises, as ``error: …``."""
        proc = self.python(
            f"""
try:
    v = store.get({name!r})
    print(repr(v.decode()) if v is not None else 'None')
except CredentialError as exc:
    print('error: ' + str(exc))
"""
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.rstrip("\n")

    def policy(self, text: str) -> None:
        self.config.mkdir(mode=0o700, exist_ok=True)
        path = self.config / "policy.toml"
        path.write_text(f'allowed_roots = ["{self.home}"]\n' + text)
        path.chmod(0o600)

    def everything(self) -> list[Path]:
        return [p for p in self.root.rglob("*") if p.is_file()]


@pytest.fixture
def box(tmp_path: Path) -> Box:
    return Box(tmp_path)


def _value() -> str:
    return "canary-" + secrets.token_urlsafe(24)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_without_a_keyring_or_a_choice_creds_add_names_the_file_store(box: Box) -> None:
    value = _value()
    proc = box.cli("creds", "add", "tok", stdin=value.encode())
    error = one_line_error(proc)
    assert "no usable OS keyring" in error
    assert "--store file" in error
    assert 'credential_store = "file"' in error
    assert "file permissions are the boundary" in error
    assert value not in proc.stdout + proc.stderr
    # Never chosen silently: nothing was stored anywhere.
    assert not box.files_dir.exists()
    assert not any(value.encode() in p.read_bytes() for p in box.everything())


def test_store_file_keeps_a_0600_file_in_a_0700_dir_and_the_daemon_reads_it(box: Box) -> None:
    value = _value()
    box.policy('[credentials.tok]\nallow = ["git *"]\n')
    # The owner's umask does not matter: the modes are set by endpointd, not inherited.
    added = box.cli("creds", "add", "tok", "--store", "file", stdin=(value + "\n").encode())
    assert added.returncode == 0, added.stderr
    assert "stored credential tok in a file" in added.stdout
    assert "file permissions are the boundary" in added.stdout
    assert _mode(box.files_dir) == 0o700
    stored = box.files_dir / "tok"
    assert _mode(stored) == 0o600
    assert stored.read_bytes() == value.encode()  # one trailing newline removed, as ever
    # No temporary file left beside it, and the value is in no other file.
    assert sorted(p.name for p in box.files_dir.iterdir()) == ["tok"]
    holding = [p for p in box.everything() if value.encode() in p.read_bytes()]
    assert holding == [stored]
    assert value not in added.stdout + added.stderr

    # The daemon's store reads it with no keyring at all.
    assert box.get("tok") == repr(value)
    values = box.python("print(json.dumps(sorted(store.values())))")
    assert json.loads(values.stdout) == ["tok"]

    rows = {r["name"]: r for r in json.loads(box.cli("creds", "list", "--json").stdout)}
    assert rows["tok"]["stored"] is True
    assert rows["tok"]["store"] == "file"
    listed = box.cli("creds", "list")
    assert "store: file " in listed.stdout
    assert str(stored) in listed.stdout

    removed = box.cli("creds", "remove", "tok")
    assert removed.returncode == 0, removed.stderr
    assert not stored.exists()
    assert box.get("tok") == "None"
    again = box.cli("creds", "rm", "tok")
    assert "no credential named tok" in one_line_error(again)


def test_umask_zero_still_gives_private_modes(box: Box) -> None:
    value = _value()
    proc = subprocess.run(
        [
            "sh",
            "-c",
            'umask 000 && exec "$0" -m endpointd creds add tok --store file',
            sys.executable,
        ],
        cwd=tempfile.gettempdir(),
        env=box.env,
        input=value.encode(),
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert _mode(box.files_dir) == 0o700
    assert _mode(box.files_dir / "tok") == 0o600


def test_both_stores_are_listed_and_removed(box: Box) -> None:
    keyring_env = {"PYTHON_KEYRING_BACKEND": PLAINTEXT_KEYRING}
    in_keyring = box.cli("creds", "add", "ring-tok", stdin=_value().encode(), env=keyring_env)
    assert in_keyring.returncode == 0, in_keyring.stderr
    assert "in the OS keyring" in in_keyring.stdout
    in_file = box.cli("creds", "add", "file-tok", "--store", "file", stdin=_value().encode())
    assert in_file.returncode == 0, in_file.stderr
    rows = {r["name"]: r for r in json.loads(box.cli("creds", "list", "--json").stdout)}
    assert rows["ring-tok"]["store"] == "keyring"
    assert rows["file-tok"]["store"] == "file"
    assert not (box.files_dir / "ring-tok").exists()

    # Moving a credential between stores takes --replace, and leaves it in one place only.
    moved = box.cli(
        "creds",
        "add",
        "ring-tok",
        "--store",
        "file",
        "--replace",
        stdin=_value().encode(),
        env=keyring_env,
    )
    assert moved.returncode == 0, moved.stderr
    ring_env = {**box.env, **keyring_env}
    ring = subprocess.run(
        [
            sys.executable,
            "-c",
            "import keyring; print(keyring.get_password('superagent-endpointd',"
            " 'credential:ring-tok'))",
        ],
        env=ring_env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tempfile.gettempdir(),
    )
    assert ring.stdout == "None\n", ring.stderr
    assert (box.files_dir / "ring-tok").exists()

    # A file-store credential is removed without any keyring.
    assert box.cli("creds", "remove", "file-tok").returncode == 0
    assert box.cli("creds", "remove", "ring-tok").returncode == 0
    assert json.loads(box.cli("creds", "list", "--json").stdout) == []
    assert list(box.files_dir.iterdir()) == []


def test_the_policy_chooses_the_store_and_the_flag_may_not_weaken_it(box: Box) -> None:
    box.policy('credential_store = "file"\n')
    added = box.cli("creds", "add", "tok", stdin=_value().encode())
    assert added.returncode == 0, added.stderr
    assert (box.files_dir / "tok").exists()

    box.policy('credential_store = "keyring"\n')
    refused = box.cli("creds", "add", "other", "--store", "file", stdin=_value().encode())
    error = one_line_error(refused)
    assert 'credential_store = "keyring"' in error
    assert str(box.config / "policy.toml") in error
    assert not (box.files_dir / "other").exists()

    box.policy('credential_store = "vault"\n')
    broken = box.cli("creds", "add", "other", "--store", "file", stdin=_value().encode())
    assert "credential_store" in one_line_error(broken)
    assert not (box.files_dir / "other").exists()


@pytest.mark.parametrize("name", ["../x", "a/b", "..", "/abs/x", ".x", "a/../../x"])
def test_a_name_cannot_leave_the_directory(box: Box, name: str) -> None:
    value = _value()
    box.files_dir.mkdir(parents=True, mode=0o700)
    before = set(box.everything())
    proc = box.cli("creds", "add", "--store", "file", "--", name, stdin=value.encode())
    assert proc.returncode != 0
    assert "invalid credential name" in proc.stderr or "Invalid value" in proc.stderr
    assert set(box.everything()) == before
    assert not Path("/abs").exists()
    # The library refuses too, whoever calls it.
    lib = box.python(
        f"""
try:
    store.add({name!r}, {value!r}.encode(), store='file')
    print('stored')
except CredentialError as exc:
    print('refused: ' + str(exc))
"""
    )
    assert lib.returncode == 0, lib.stderr
    assert lib.stdout.startswith("refused: invalid credential name")
    assert set(box.everything()) == before


def test_loose_modes_a_foreign_owner_and_symlinks_are_refused(box: Box, tmp_path: Path) -> None:
    value = _value()
    assert box.cli("creds", "add", "tok", "--store", "file", stdin=value.encode()).returncode == 0
    stored = box.files_dir / "tok"

    stored.chmod(0o644)
    error = box.get("tok")
    assert error.startswith("error: ")
    assert str(stored) in error
    assert f"chmod 600 {stored}" in error
    assert value not in error
    stored.chmod(0o600)

    box.files_dir.chmod(0o755)
    error = box.get("tok")
    assert str(box.files_dir) in error
    assert f"chmod 700 {box.files_dir}" in error
    # ...and nothing new is written into a directory others can look into.
    more = box.cli("creds", "add", "more", "--store", "file", stdin=_value().encode())
    assert f"chmod 700 {box.files_dir}" in one_line_error(more)
    assert not (box.files_dir / "more").exists()
    box.files_dir.chmod(0o700)
    assert box.get("tok") == repr(value)

    if os.geteuid() == 0:
        # Another user's file, even 0600, may hold what that user chose: not ours to deliver.
        os.chown(stored, 65534, 65534)
        error = box.get("tok")
        assert str(stored) in error
        assert "owned by" in error
        os.chown(stored, 0, 0)

    # A symlink planted where the credential was: never followed.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("attacker-chosen-value")
    elsewhere.chmod(0o600)
    stored.unlink()
    stored.symlink_to(elsewhere)
    error = box.get("tok")
    assert error.startswith("error: ")
    assert str(stored) in error
    assert "attacker-chosen-value" not in error

    # The directory itself replaced by a symlink: refused, not followed.
    stored.unlink()
    box.files_dir.rmdir()
    real = tmp_path / "real-dir"
    real.mkdir(mode=0o700)
    box.files_dir.symlink_to(real)
    add = box.cli("creds", "add", "tok", "--store", "file", "--replace", stdin=value.encode())
    assert str(box.files_dir) in one_line_error(add)
    assert list(real.iterdir()) == []


def test_the_temp_file_is_private_and_synced_before_it_is_renamed(
    box: Box, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In-process, watching the syscalls: the value is never in a file others could open."""
    from endpointd.secrets import file_store

    seen: list[tuple[str, object]] = []
    real_replace, real_fsync = os.replace, os.fsync

    def replace(
        src: str, dst: str, *, src_dir_fd: int | None = None, dst_dir_fd: int | None = None
    ) -> None:
        st = os.stat(src, dir_fd=src_dir_fd)
        seen.append(("replace", stat.S_IMODE(st.st_mode)))
        real_replace(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

    def fsync(fd: int) -> None:
        seen.append(("fsync", stat.S_ISREG(os.fstat(fd).st_mode)))
        real_fsync(fd)

    # file_store calls os.replace and os.fsync through the os module: patch them there.
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "fsync", fsync)
    old = os.umask(0)
    try:
        file_store.FileStore(box.files_dir).write("tok", _value())
    finally:
        os.umask(old)
    # The data reached the disk, then the rename, then the directory entry.
    assert seen == [("fsync", True), ("replace", 0o600), ("fsync", False)]


def test_status_names_the_store_and_its_boundary(box: Box) -> None:
    box.policy('credential_store = "file"\n')
    assert box.cli("creds", "add", "tok", stdin=_value().encode()).returncode == 0
    shown = box.cli("status")
    assert shown.returncode == 0, shown.stderr
    lines = [line for line in shown.stdout.splitlines() if line.startswith("credentials:")]
    assert len(lines) == 1, shown.stdout
    assert "1 in files" in lines[0]
    assert str(box.files_dir) in lines[0]
    assert "file permissions are the boundary" in lines[0]
    report = json.loads(box.cli("status", "--json").stdout)
    creds = report["credentials"]
    assert creds["file"] == 1
    assert creds["keyring"] == 0
    assert creds["directory"] == str(box.files_dir)
    assert creds["default_store"] == "file"
    assert "file permissions are the boundary" in creds["boundary"]


@pytest.mark.parametrize("name", ["../x", "a/b", "..", "/abs/x", ".x", "x\x00y", ""])
def test_the_file_store_itself_refuses_a_path_for_a_name(tmp_path: Path, name: str) -> None:
    """Defence in depth: whatever a caller checked, no name becomes a path."""
    from endpointd.secrets.file_store import FileStore, FileStoreError

    files = FileStore(tmp_path / "credentials")
    with pytest.raises(FileStoreError, match="invalid credential name"):
        files.write(name, _value())
    with pytest.raises(FileStoreError, match="invalid credential name"):
        files.read(name)
    with pytest.raises(FileStoreError, match="invalid credential name"):
        files.delete(name)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_the_credential_files_are_a_denied_path_of_their_own(box: Box) -> None:
    """Named in refusals, and denied even to a policy whose allowed root holds them."""
    from endpointd.guard.policy import Policy

    box.config.mkdir(mode=0o700)
    path = box.config / "policy.toml"
    path.write_text(f'allowed_roots = ["{box.root}"]\ncredential_store = "file"\n')
    path.chmod(0o600)
    policy = Policy(path, state_dir=box.state, home=box.home)
    assert policy.rules is not None
    assert policy.rules.credential_store == "file"
    rule = "denied_paths: endpointd credential files"
    assert policy.denied_rule(str(box.files_dir / "tok")) == rule
    assert policy.check_path(str(box.files_dir / "tok")).rule == rule
