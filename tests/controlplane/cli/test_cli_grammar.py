"""One grammar for every `superagent` command: each takes --json (machine-readable output,
for the ones that change state too), walked over the whole command tree so that a new
command without it fails here."""

from __future__ import annotations

import json

import click

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
