"""`--help` teaches, for every command of both programs: it answers, and says what the
command does. A command added without a docstring, or whose options break its help, fails
here by name."""

from __future__ import annotations

from collections.abc import Iterator

import click
import pytest
from click.testing import CliRunner

from controlplane.cli.main import cli as superagent
from endpointd.cli import cli as endpointd


def _commands(group: click.Group, path: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is None or command.hidden:
            continue
        yield (*path, name)
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))


PROGRAMS = {"superagent": superagent, "endpointd": endpointd}
EVERY = [
    (program, args) for program, root in PROGRAMS.items() for args in [(), *_commands(root, ())]
]


def test_both_programs_have_their_commands() -> None:
    found = {(p, a[0]) for p, a in EVERY if a}
    assert {("superagent", "up"), ("superagent", "say"), ("superagent", "status")} <= found
    assert {("endpointd", "pair"), ("endpointd", "creds"), ("endpointd", "run")} <= found


@pytest.mark.parametrize(("program", "args"), EVERY, ids=lambda v: " ".join(v) or "-")
def test_help_answers_and_says_what_the_command_does(program: str, args: tuple[str, ...]) -> None:
    result = CliRunner().invoke(PROGRAMS[program], [*args, "--help"], prog_name=program)
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"Usage: {' '.join((program, *args))}")
    description = result.output.split("\n\n", 2)[1].strip()
    assert description, f"`{program} {' '.join(args)}` has no description"
    assert not description.startswith("Options:"), f"`{program} {' '.join(args)}` has none"
