"""The fetch of a workspace needs a credential: the owner's own git setup first, else the
one the owner stored in endpointd for that host, which never leaves endpointd's helper (not
in the owner's credential store, config, log or anything sent), and never goes to another
host."""

from __future__ import annotations

import secrets
import subprocess
import sys
from pathlib import Path

from tests.endpointd.workspaces.device_world import git, start_device
from tests.fakes.endpointd_process import Endpointd
from tests.fakes.gateway_server import FakeGateway
from tests.fakes.git_server import GitServer
from tests.fakes.https_server import TestCA

A, B = "tkt_aaaaaaaaaaaa", "tkt_bbbbbbbbbbbb"
NAME = "widgets-token"


def _origin(tmp: Path) -> tuple[Path, Path]:
    """(served root, clone): acme/widgets.git with one commit, and the owner's clone."""
    served, seed, clone = tmp / "served", tmp / "seed", tmp / "work" / "widgets"
    (served / "acme").mkdir(parents=True)
    git("init", "-q", "-b", "main", str(seed), cwd=tmp)
    (seed / "README.md").write_text("widgets\n")
    git("add", "-A", cwd=seed)
    git("commit", "-qm", "first", cwd=seed)
    git("clone", "-q", "--bare", str(seed), str(served / "acme" / "widgets.git"), cwd=tmp)
    clone.parent.mkdir()
    git("clone", "-q", str(served / "acme" / "widgets.git"), str(clone), cwd=tmp)
    return served, clone


def _store(endpointd: Endpointd, value: str) -> None:
    endpointd.config_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    stored = subprocess.run(
        [sys.executable, "-m", "endpointd", "creds", "add", NAME],
        input=(value + "\n").encode(),
        capture_output=True,
        env=endpointd.env,
        cwd=endpointd.root,
        timeout=60,
    )
    assert stored.returncode == 0, stored.stderr.decode()


async def test_a_stored_credential_fetches_for_its_host_and_goes_nowhere_else(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    password = "canary-fetch-" + secrets.token_hex(12)
    served, clone = _origin(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    # The owner's own git stores what it is given: it must never be given the stored one.
    (home / ".gitconfig").write_text("[credential]\n\thelper = store\n")
    ca = TestCA(tmp_path / "ca")
    endpointd.env["HOME"] = str(home)
    endpointd.env["GIT_SSL_CAINFO"] = str(ca.ca_file)
    endpointd.use_file_keyring(tmp_path / "keyring")
    _store(endpointd, password)
    with GitServer(served, password, ca=ca) as server:
        git("remote", "set-url", "origin", server.url("acme/widgets"), cwd=clone)
        git("remote", "set-head", "origin", "main", cwd=clone)
        scope = f'[credentials.{NAME}]\nallow = ["git push *"]\nhosts = ["{server.host}"]\n'
        device = await start_device(gw, endpointd, [clone.parent], scope)
        _, answer = await device.prepare(A, repo="", path=str(clone))
        assert answer["created"] is True
        ws = Path(str(answer["path"]))
        assert (ws / "README.md").read_text() == "widgets\n"
        assert server.denied > 0  # the owner's own setup was tried first, without it

        # A credential for another host is not offered to this one.
        other = f'[credentials.{NAME}]\nallow = ["git push *"]\nhosts = ["github.com"]\n'
        (endpointd.config_dir / "policy.toml").write_text(
            (endpointd.config_dir / "policy.toml").read_text().replace(scope, other)
        )
        done, _ = await device.prepare(B, repo="", path=str(clone), expect_ok=False)
        assert done.exit_code == 1
        assert "git fetch origin main failed" in done.error
        assert "terminal prompts disabled" in done.error

    # The value is nowhere but endpointd's keyring.
    sent = b"".join(m.SerializeToString() for m in gw.messages())
    assert password.encode() not in sent
    assert password not in endpointd.log()
    assert not (home / ".git-credentials").exists()
    for path in (clone / ".git").rglob("*"):
        if path.is_file():
            assert password.encode() not in path.read_bytes(), path
