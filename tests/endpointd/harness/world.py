"""A device with Qwen Code for the harness tests that run the real endpointd: the owner's
home (where qwen keeps its sessions and settings), a workspace under the allowed root,
qwen's key stored as an endpointd credential, and a policy that allows qwen with its
endpoint pointed at the fake model server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from superagent_proto.v1 import endpoint_pb2 as pb
from tests.endpointd.workspaces.device_world import Device, start_device
from tests.fakes.endpointd_process import Endpointd
from tests.fakes.gateway_server import FakeGateway
from tests.fakes.openai_server import FAKE_MODEL, FakeOpenAIServer

REPO_ROOT = Path(__file__).resolve().parents[3]
QWEN = REPO_ROOT / ".tools" / "harnesses" / "node_modules" / ".bin" / "qwen"
KEY_NAME = "qwen-key"


def require_qwen() -> Path:
    """Qwen Code as bootstrap installs it; a clear failure (never a skip) without it."""
    assert os.access(QWEN, os.X_OK), (
        f"Qwen Code is not installed at {QWEN}: run scripts/bootstrap (it installs the"
        " harnesses with npm into .tools/harnesses)"
    )
    return QWEN


def store_credential(endpointd: Endpointd, name: str, value: str) -> None:
    endpointd.config_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    stored = subprocess.run(
        [sys.executable, "-m", "endpointd", "creds", "add", name],
        input=(value + "\n").encode(),
        capture_output=True,
        env=endpointd.env,
        cwd=endpointd.root,
        timeout=60,
    )
    assert stored.returncode == 0, stored.stderr.decode()


def harness_policy(fake: FakeOpenAIServer, *, allowed: str = '["qwen"]', extra: str = "") -> str:
    return (
        f"[harness]\nallowed = {allowed}\n"
        f"[harness.qwen]\nprogram = {json.dumps(str(QWEN))}\nmodel = {json.dumps(FAKE_MODEL)}\n"
        f"base_url = {json.dumps(fake.url)}\ncredential = {json.dumps(KEY_NAME)}\n"
        f"max_turns = 20\n{extra}"
    )


@dataclass
class QwenDevice:
    device: Device
    home: Path
    workspace: Path

    @property
    def gw(self) -> FakeGateway:
        return self.device.gw

    async def run(
        self, prompt: str, *, timeout: float = 120, **fields: object
    ) -> tuple[pb.Finished | pb.Refused, bytes]:
        fields.setdefault("harness", "qwen")
        fields.setdefault("cwd", str(self.workspace))
        request = pb.RunHarness(prompt=prompt, **fields)  # type: ignore[arg-type]
        return await self.device.run(pb.Command(run_harness=request), timeout)

    def send(self, prompt: str, **fields: object) -> pb.Command:
        fields.setdefault("harness", "qwen")
        fields.setdefault("cwd", str(self.workspace))
        request = pb.RunHarness(prompt=prompt, **fields)  # type: ignore[arg-type]
        return self.gw.send(self.device.device_id, pb.Command(run_harness=request))


async def start_qwen_device(
    gw: FakeGateway,
    endpointd: Endpointd,
    tmp_path: Path,
    fake: FakeOpenAIServer,
    *,
    policy: str | None = None,
) -> QwenDevice:
    """The daemon with HOME at ``tmp_path/home``, the fake's key stored as qwen's
    credential, paired, running, and its policy allowing qwen."""
    require_qwen()
    home = tmp_path / "home"
    home.mkdir()
    work = tmp_path / "work"
    workspace = work / "app"
    workspace.mkdir(parents=True)
    endpointd.env["HOME"] = str(home)
    endpointd.use_file_keyring(tmp_path / "keyring")
    assert fake.api_key is not None
    store_credential(endpointd, KEY_NAME, fake.api_key)
    device = await start_device(
        gw, endpointd, [work], harness_policy(fake) if policy is None else policy
    )
    return QwenDevice(device, home, workspace)


def events(output: bytes) -> list[dict[str, object]]:
    """The JSON events of a stream-json output (one object per line)."""
    out = []
    for line in output.decode("utf-8", "replace").splitlines():
        line = line.strip()
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def session_id(output: bytes) -> str:
    for event in events(output):
        if event.get("type") == "system" and event.get("subtype") == "init":
            sid = event.get("session_id")
            assert isinstance(sid, str)
            return sid
    raise AssertionError(f"no init event in {output[:2000]!r}")
