"""Both command lines fail the same way: one ``error: …`` line on stderr (after the usage
line for a usage error), exit status 2 for a usage error and 1 otherwise. Click's own
rendering once said ``Error: …`` where the programs said ``error: …``."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support.cli_output import read_to_end

PROGRAMS = {"superagent": "controlplane.cli", "endpointd": "endpointd"}


def _run(
    program: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", PROGRAMS[program], *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tempfile.gettempdir(),  # not the checkout, whose folders shadow the packages
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize("program", PROGRAMS)
def test_a_usage_error_is_the_usage_a_hint_and_one_error_line(program: str) -> None:
    done = _run(program, "no-such-command")
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert lines[0].startswith(f"Usage: {program} "), done.stderr
    assert lines[1] == f"Try '{program} --help' for help.", done.stderr
    assert lines[-1] == "error: No such command 'no-such-command'.", done.stderr
    assert "Error" not in done.stderr


def test_a_failure_of_either_program_is_one_error_line(tmp_path: Path) -> None:
    failures = {
        "endpointd": _run("endpointd", "unpair", env={"ENDPOINTD_CONFIG_DIR": str(tmp_path / "c")}),
        "superagent": _run("superagent", "say", "--url", "ftp://nowhere", "--no-wait", "hello"),
    }
    for program, done in failures.items():
        assert done.returncode == 1, (program, done)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, (program, done.stderr)
        assert lines[0].startswith("error: "), (program, done.stderr)


_STYLED = """
import click
from superagent_shared.cli_errors import run

@click.command()
def styled() -> None:
    click.echo(click.style("bold", bold=True) + " " + click.style("red", fg="red"))

run(styled, "styled")
"""


@pytest.mark.parametrize(("no_color", "styled"), [("", True), ("1", False)])
def test_no_color_turns_styles_off_even_on_a_terminal(no_color: str, styled: bool) -> None:
    master, slave = os.openpty()
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    if no_color:
        env["NO_COLOR"] = no_color
    done = subprocess.run(
        [sys.executable, "-c", _STYLED], stdout=slave, stderr=slave, env=env, timeout=60
    )
    os.close(slave)
    shown = read_to_end(master)
    assert done.returncode == 0, shown
    assert b"bold red" in shown.replace(b"\x1b[1m", b"").replace(b"\x1b[31m", b"").replace(
        b"\x1b[0m", b""
    )
    assert (b"\x1b[" in shown) is styled, shown
