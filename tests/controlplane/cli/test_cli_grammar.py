"""One grammar for every `superagent` command: each takes --json (machine-readable output,
for the ones that change state too), walked over the whole command tree so that a new
command without it fails here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

from controlplane.cli.main import cli
from tests.support.helpers import run_cli


def _leaves(
    group: click.Group, ctx: click.Context, path: list[str]
) -> list[tuple[str, click.Command]]:
    found = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        if isinstance(command, click.Group):
            found += _leaves(command, ctx, [*path, name])
        else:
            found.append((" ".join([*path, name]), command))
    return found


def test_every_command_takes_json() -> None:
    leaves = _leaves(cli, click.Context(cli), ["superagent"])
    assert len(leaves) > 30  # the walk found the tree, lazily loaded commands included
    missing = [
        path
        for path, command in leaves
        if not any("--json" in getattr(p, "opts", ()) for p in command.params)
    ]
    assert not missing, f"without --json: {', '.join(missing)}"


def test_commands_that_change_state_answer_one_json_document(database_url: str) -> None:
    paused = run_cli(database_url, "pause", "--reason", "upgrading", "--by", "ops", "--json")
    assert paused.returncode == 0, paused.stderr
    assert json.loads(paused.stdout) | {"since": None} == {
        "paused": True,
        "since": None,
        "by": "ops",
        "reason": "upgrading",
    }
    resumed = run_cli(database_url, "resume", "--json")
    assert resumed.returncode == 0, resumed.stderr
    answer = json.loads(resumed.stdout)
    assert (answer["resumed"], answer["paused_by"]) == (True, "ops")
    again = run_cli(database_url, "resume", "--json")
    assert json.loads(again.stdout) == {"resumed": False}
    linked = run_cli(database_url, "users", "link", "alice", "web:admin", "--json")
    assert linked.returncode == 0, linked.stderr
    assert json.loads(linked.stdout) == {"person": "alice", "linked": ["web:admin"]}
    removed = run_cli(database_url, "users", "remove", "alice", "--json")
    assert json.loads(removed.stdout) == {"removed": "alice"}


@pytest.mark.parametrize("prog", ["superagent", "endpointd"])
def test_shell_completion_completes_commands_and_options(prog: str) -> None:
    """The script each program prints drives its own completion: the commands of the root
    (loaded lazily or not), and a subcommand's options."""
    program = str(Path(sys.executable).parent / prog)  # the console script, as installed
    script = subprocess.run(
        [program, "completion", "bash"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    var = f"_{prog.upper()}_COMPLETE"
    assert var in script
    assert "complete -o nosort -F" in script

    def complete(words: str) -> list[str]:
        env = {**os.environ, var: "bash_complete", "COMP_WORDS": words}
        env["COMP_CWORD"] = str(len(words.split()) - (0 if words.endswith(" ") else 1))
        done = subprocess.run([program], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return [line.split(",", 1)[1] for line in done.stdout.splitlines() if "," in line]

    if prog == "superagent":
        assert {"tickets", "tokens"} <= set(complete("superagent to")) | set(
            complete("superagent ti")
        )
        assert "--json" in complete("superagent tickets list --")
    else:
        assert "pair" in complete("endpointd pa")
        assert "--json" in complete("endpointd status --")
