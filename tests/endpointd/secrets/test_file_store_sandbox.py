"""The file store on a real daemon: delivered like a keyring value, unreadable to commands.

A paired endpointd with keyring's fail backend (a headless box) and ``credential_store =
"file"`` in its policy. An allowed command receives the credential by env and by file; a
command that goes for the credential files directly (through a shell, with the path
assembled at run time so no argv check sees it, and through Python) is stopped by the
kernel, and the value reaches the control plane in no form.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from endpointd.guard import landlock
from superagent_proto.v1 import endpoint_pb2 as pb
from tests.fakes.endpointd_process import Endpointd, endpointd_in, start_paired
from tests.fakes.gateway_server import FakeGateway
from tests.support.helpers import assert_eventually

pytestmark = pytest.mark.skipif(landlock.abi_version() < 6, reason="needs Landlock ABI 6")

TOKEN_NAME = "deploy-token"
TOKEN = "file-store-canary-" + os.urandom(12).hex()
PYTHON = os.path.realpath(sys.executable)


@pytest.fixture
def endpointd(tmp_path: Path) -> Iterator[Endpointd]:
    with endpointd_in(tmp_path) as daemon:
        assert daemon.env["PYTHON_KEYRING_BACKEND"] == "keyring.backends.fail.Keyring"
        yield daemon


def _exec(argv: list[str], cwd: Path, creds: list[pb.CredentialRef] | None = None) -> pb.Command:
    return pb.Command(exec=pb.ExecCommand(argv=argv, cwd=str(cwd)), credentials=creds or [])


async def _run(gw: FakeGateway, device: str, command: pb.Command) -> tuple[pb.Finished, bytes]:
    sent = gw.send(device, command)
    ended = await assert_eventually(
        lambda: gw.refused(sent.command_id) or gw.finished(sent.command_id), timeout=30
    )
    assert isinstance(ended, pb.Finished), f"refused: {ended}"
    return ended, gw.output(sent.command_id)


def _nowhere(gw: FakeGateway, secret: str) -> None:
    sent = b"".join(m.SerializeToString() for m in gw.messages())
    squeezed = b"".join(sent.split())
    raw = secret.encode()
    for form in (raw, raw[::-1], raw.hex().encode(), raw.hex().encode()[::-1]):
        assert form not in sent, "the credential reached the server"
        assert form not in squeezed, "the credential reached the server (spaced)"


def _hidden(path: Path) -> str:
    return f"$(echo {str(path)[::-1]} | rev)"


async def test_file_store_credentials_are_delivered_but_unreadable_to_commands(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    device = await start_paired(gw, endpointd)
    python = PYTHON
    policy = endpointd.config_dir / "policy.toml"
    policy.write_text(
        f"""
allowed_roots = [{json.dumps(str(work))}]
default_action = "allow"
credential_store = "file"

[credentials.{TOKEN_NAME}]
allow = [{json.dumps(python + " deploy.py")}]
"""
    )
    policy.chmod(0o600)
    # No --store: the policy's credential_store chooses, as the owner of a headless box would.
    added = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "endpointd", "creds", "add", TOKEN_NAME],
        input=TOKEN,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tempfile.gettempdir(),
        env=endpointd.env,
    )
    assert added.returncode == 0, added.stderr
    files = endpointd.config_dir / "credentials"
    assert (files / TOKEN_NAME).read_text() == TOKEN

    # Delivered by env and by file, exactly as a keyring value would be.
    (work / "deploy.py").write_text(
        "import hashlib, os\n"
        "env = os.environ['TOKEN'].encode()\n"
        "data = open(os.environ['TOKEN_FILE'], 'rb').read()\n"
        "print(hashlib.sha256(env).hexdigest(), hashlib.sha256(data).hexdigest())\n"
        "print('echoed', env.decode())\n"
    )
    creds = [
        pb.CredentialRef(name=TOKEN_NAME, delivery=pb.CredentialRef.DELIVERY_ENV, env_var="TOKEN"),
        pb.CredentialRef(
            name=TOKEN_NAME, delivery=pb.CredentialRef.DELIVERY_FILE, env_var="TOKEN_FILE"
        ),
    ]
    done, out = await _run(gw, device, _exec([python, "deploy.py"], work, creds))
    assert done.exit_code == 0, out
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    assert out.splitlines()[0] == f"{digest} {digest}".encode(), out
    # What it printed of the value was masked on the way out.
    assert b"echoed " in out
    assert TOKEN.encode() not in out
    _nowhere(gw, TOKEN)

    # The attacker: the policy allows any command; the kernel keeps the files shut.
    script = (
        f"D={_hidden(files)}; ls $D; cat $D/{TOKEN_NAME} | od -An -tx1;"
        f" ln -s $D link && cat link/{TOKEN_NAME} | rev; echo tried"
    )
    _, out = await _run(gw, device, _exec(["sh", "-c", script], work))
    assert b"tried" in out, out
    # Refused, or (the config dir not being in a command's view at all) not there.
    assert b"Permission denied" in out or b"No such file" in out, out
    read = (
        "import os, binascii\n"
        f"d = {str(files)[::-1]!r}[::-1]\n"
        "try:\n"
        "    for f in os.listdir(d):\n"
        "        print(binascii.hexlify(open(os.path.join(d, f), 'rb').read()))\n"
        "except OSError as exc:\n"
        "    print('denied', type(exc).__name__)\n"
    )
    _, out = await _run(gw, device, _exec([python, "-c", read], work))
    assert b"denied PermissionError" in out or b"denied FileNotFoundError" in out, out
    _nowhere(gw, TOKEN)

    # The owner sees where the credentials are and what guards them.
    status = json.loads(endpointd.cli("status", "--json").stdout)
    assert status["credentials"]["file"] == 1
    assert "file permissions are the boundary" in status["credentials"]["boundary"]
