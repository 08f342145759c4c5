"""`superagent --help` and `superagent say --help` load click and nothing heavy.

They once imported every command module to list them (openai, SQLAlchemy, Alembic,
FastAPI: about 2 s of CPU on a 2-core machine, against 0.1 s for `endpointd --help`). CPU
time is measured in bench/cli_startup.py; here, what the help loads is checked exactly, in
a fresh interpreter, so the test cannot pass by luck of a fast machine.
"""

from __future__ import annotations

import json
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from controlplane.cli.main import COMMANDS, cli

# What no help may load: each costs a tenth of a second or more to import.
HEAVY = (
    "openai",
    "sqlalchemy",
    "alembic",
    "fastapi",
    "starlette",
    "aiohttp",
    "asyncpg",
    "httpx",
    "websockets",
    "pydantic",
    "grpc",
    "controlplane.settings",
)

_PROBE = """
import json, sys
from controlplane.cli.main import main
sys.argv = ["superagent", *json.loads(sys.argv[1])]
try:
    main()
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


def _loaded_by(args: list[str]) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    if "--help" in args:
        assert done.stdout.startswith("Usage: superagent"), done.stdout
    return set(json.loads(done.stderr.strip().splitlines()[-1]))


@pytest.mark.parametrize("args", [["--help"], ["say", "--help"]], ids=" ".join)
def test_the_help_loads_nothing_heavy(args: list[str]) -> None:
    loaded = _loaded_by(args)
    heavy = sorted(m for m in loaded if m.split(".")[0] in HEAVY or m in HEAVY)
    assert not heavy, f"`superagent {' '.join(args)}` imports {heavy}"
    # The probe can see a heavy import: the command itself loads them.
    assert "httpx" in _loaded_by(["say", "--no-wait", "--url", "bad", "hi"])


def test_each_command_is_listed_by_the_line_it_describes_itself_with() -> None:
    listing = CliRunner().invoke(cli, ["--help"], prog_name="superagent").output
    ctx = click.Context(cli)
    for name, (_, summary) in COMMANDS.items():
        assert f"  {name} " in listing, listing
        assert summary in listing, (name, listing)
        # A line that fits: click would cut a longer one with "...".
        assert len(summary) <= 65, (name, summary)
        assert summary.endswith("."), (name, summary)
        command = cli.get_command(ctx, name)
        assert isinstance(command, click.Command), name
        assert command.get_short_help_str(80) == summary
