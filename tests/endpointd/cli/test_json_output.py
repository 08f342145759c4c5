"""Every `endpointd` command takes `--json` and then prints one JSON document on stdout.

The tree is walked the way `endpointd --help` lists it (the root group's list_commands and
get_command, down every group), so a command added without `--json` fails here by name.
The state-changing commands run for real, as subprocesses with scratch directories.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from endpointd import __version__
from endpointd.cli import cli
from superagent_shared.protocol import PROTOCOL_VERSION, PROTOCOL_VERSION_NUMBER
from tests.fakes.endpointd_process import Endpointd, start_paired
from tests.fakes.gateway_server import FakeGateway


def _leaves(
    group: click.Group, ctx: click.Context, path: tuple[str, ...] = ()
) -> Iterator[tuple[str, click.Command]]:
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        here = (*path, name)
        if isinstance(command, click.Group):
            yield from _leaves(command, click.Context(command, info_name=name, parent=ctx), here)
        else:
            yield " ".join(here), command


def _json_option(command: click.Command) -> click.Option | None:
    for param in command.params:
        if isinstance(param, click.Option) and "--json" in param.opts:
            return param
    return None


def test_every_command_takes_json() -> None:
    leaves = dict(_leaves(cli, click.Context(cli, info_name="endpointd")))
    assert len(leaves) > 20  # the walk reached the groups' commands too
    missing = sorted(name for name, command in leaves.items() if _json_option(command) is None)
    assert not missing, f"endpointd commands without --json: {', '.join(missing)}"
    for name, command in leaves.items():
        option = _json_option(command)
        assert option is not None
        assert option.is_flag, name
        assert option.name == "as_json", name
        assert (option.help or "").startswith("Machine-readable output"), (name, option.help)


def _endpointd(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "ENDPOINTD_CONFIG_DIR": str(tmp_path / "c"),
        "ENDPOINTD_STATE_DIR": str(tmp_path / "s"),
        "ENDPOINTD_SERVICE_DIR": str(tmp_path / "units"),
        "PYTHON_KEYRING_BACKEND": "keyring.backends.fail.Keyring",
    }
    return subprocess.run(
        [sys.executable, "-m", "endpointd", *args],
        cwd=tempfile.gettempdir(),
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_version_json() -> None:
    proc = _endpointd(Path(tempfile.gettempdir()), "version", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {
        "version": __version__,
        "protocol_version": PROTOCOL_VERSION,
        "protocol_version_number": PROTOCOL_VERSION_NUMBER,
    }


def test_policy_init_json_names_the_file_it_wrote(tmp_path: Path) -> None:
    root = tmp_path / "src"
    root.mkdir()
    proc = _endpointd(tmp_path, "policy", "init", "--allow-root", str(root), "--json")
    assert proc.returncode == 0, proc.stderr
    written = json.loads(proc.stdout)
    assert written == {
        "created": True,
        "path": str(tmp_path / "c" / "policy.toml"),
        "allowed_roots": [str(root)],
    }
    assert str(root) in Path(written["path"]).read_text()
    again = _endpointd(tmp_path, "policy", "init", "--json")
    assert again.returncode == 1
    assert again.stdout == ""
    assert again.stderr.startswith("error: ")
    assert "already exists" in again.stderr


@pytest.mark.skipif(sys.platform != "linux", reason="a systemd user unit")
def test_service_install_and_uninstall_json(tmp_path: Path) -> None:
    unit = tmp_path / "units" / "endpointd.service"
    proc = _endpointd(tmp_path, "service", "install", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {
        "installed": True,
        "path": str(unit),
        "started": False,
        "enable": ["systemctl", "--user", "enable", "--now", "endpointd"],
    }
    assert unit.is_file()
    removed = json.loads(_endpointd(tmp_path, "service", "uninstall", "--json").stdout)
    assert (removed["removed"], removed["path"], removed["stopped"]) == (True, str(unit), False)
    assert not unit.exists()
    nothing = json.loads(_endpointd(tmp_path, "service", "uninstall", "--json").stdout)
    assert nothing["removed"] is False


async def test_run_json_logs_one_object_per_line(gw: FakeGateway, endpointd: Endpointd) -> None:
    await start_paired(gw, endpointd, "--json")
    endpointd.stop()
    lines = [line for line in endpointd.log().splitlines() if line.strip()]
    assert lines, "the daemon logged nothing"
    entries = [json.loads(line) for line in lines]
    assert {"time", "level", "logger", "message"} <= set(entries[0])
    assert any(e["level"] == "DEBUG" for e in entries)  # --log-level debug still applies
    assert any(e["logger"].startswith("endpointd") for e in entries)
