"""Every `endpointd` command takes `--json` and then prints one JSON document on stdout.

The tree is walked the way `endpointd --help` lists it (the root group's list_commands and
get_command, down every group), so a command added without `--json` fails here by name.
The state-changing commands run for real, as subprocesses with scratch directories.
"""

from __future__ import annotations

from collections.abc import Iterator

import click

from endpointd.cli import cli


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
