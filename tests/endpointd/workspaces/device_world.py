"""A device with a clone, for the workspace tests that run the real endpointd: an origin
(a bare repository reached through an https URL rewritten to it), the owner's clone under
the allowed root, and the real daemon paired with a scripted gateway.

endpointd's own git reads no repository's, global or system configuration, so the rewrite
the owner's git uses (in the clone's config) is given to endpointd in its environment
(``GIT_CONFIG_COUNT``, the owner's as its ``PATH`` is): :func:`origin_rewrite`."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from superagent_proto.v1 import endpoint_pb2 as pb
from tests.fakes.endpointd_process import Endpointd, start_paired
from tests.fakes.gateway_server import FakeGateway
from tests.support.helpers import assert_eventually

REMOTE = "https://github.com/acme/app.git"
REPO = "github.com/acme/app"


def git(*args: str, cwd: Path) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "Owner",
        "GIT_AUTHOR_EMAIL": "owner@example.com",
        "GIT_COMMITTER_NAME": "Owner",
        "GIT_COMMITTER_EMAIL": "owner@example.com",
    }
    done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def origin_rewrite(origin: Path) -> dict[str, str]:
    """endpointd's environment for reaching ``origin`` as :data:`REMOTE`."""
    return {
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": f"url.{origin.as_uri()}.insteadOf",
        "GIT_CONFIG_VALUE_0": REMOTE,
    }


def make_clone(tmp: Path, files: dict[str, str] | None = None) -> tuple[Path, Path]:
    """(origin, clone): ``tmp/work/app`` cloned from ``tmp/origin.git`` with ``files``."""
    origin, clone = tmp / "origin.git", tmp / "work" / "app"
    clone.parent.mkdir(parents=True, exist_ok=True)
    git("init", "-q", "--bare", "-b", "main", str(origin), cwd=tmp)
    git("init", "-q", "-b", "main", str(clone), cwd=tmp)
    git("config", f"url.{origin.as_uri()}.insteadOf", REMOTE, cwd=clone)
    git("remote", "add", "origin", REMOTE, cwd=clone)
    for name, content in (files or {"README.md": "widgets\n"}).items():
        path = clone / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        if name.startswith(".superagent/"):
            path.chmod(0o755)
    git("add", "-A", cwd=clone)
    git("commit", "-qm", "first", cwd=clone)
    git("push", "-q", "origin", "main", cwd=clone)
    git("remote", "set-head", "origin", "main", cwd=clone)
    return origin, clone


def write_policy(endpointd: Endpointd, roots: list[Path], extra: str = "") -> None:
    path = endpointd.config_dir / "policy.toml"
    listed = ", ".join(json.dumps(str(r)) for r in roots)
    path.write_text(f'allowed_roots = [{listed}]\ndefault_action = "allow"\n{extra}')
    path.chmod(0o600)


@dataclass
class Device:
    gw: FakeGateway
    endpointd: Endpointd
    device_id: str

    async def prepare(
        self, ticket: str, *, expect_ok: bool = True, **fields: object
    ) -> tuple[pb.Finished, dict[str, object]]:
        """PrepareWorkspace; its Finished and its JSON answer."""
        fields.setdefault("repo", REPO)
        prepare = pb.PrepareWorkspace(ticket_id=ticket, **fields)  # type: ignore[arg-type]
        command = pb.Command(prepare_workspace=prepare)
        done, out = await self.finish(command, timeout=60)
        if expect_ok:
            assert (done.exit_code, done.error) == (0, ""), self.endpointd.log()[-3000:]
        return done, json.loads(out) if out else {}

    async def release(self, ticket: str) -> pb.Finished:
        command = pb.Command(release_workspace=pb.ReleaseWorkspace(ticket_id=ticket))
        done, _ = await self.finish(command)
        return done

    async def sh(self, script: str, cwd: Path | str) -> tuple[pb.Finished, bytes]:
        command = pb.Command(exec=pb.ExecCommand(argv=["sh", "-c", script], cwd=str(cwd)))
        return await self.finish(command)

    async def finish(self, command: pb.Command, timeout: float = 30) -> tuple[pb.Finished, bytes]:
        ended, out = await self.run(command, timeout)
        assert isinstance(ended, pb.Finished), f"refused: {ended}"
        return ended, out

    async def run(
        self, command: pb.Command, timeout: float = 30
    ) -> tuple[pb.Finished | pb.Refused, bytes]:
        """Send ``command``; its result (Finished or Refused) and its output."""
        sent = self.gw.send(self.device_id, command)
        found: pb.Finished | pb.Refused = await assert_eventually(
            lambda: self.gw.refused(sent.command_id) or self.gw.finished(sent.command_id),
            timeout=timeout,
            message=self.endpointd.log()[-3000:],
        )
        return found, self.gw.output(sent.command_id)


async def start_device(
    gw: FakeGateway, endpointd: Endpointd, roots: list[Path], extra: str = ""
) -> Device:
    """The daemon paired, its policy written, connected; the origin :func:`make_clone`
    made beside the first root is reachable by its https URL."""
    origin = roots[0].parent / "origin.git" if roots else None
    if origin is not None and origin.is_dir():
        endpointd.env.update(origin_rewrite(origin))
    device_id = await start_paired(gw, endpointd)
    write_policy(endpointd, roots, extra)
    return Device(gw, endpointd, device_id)
