"""The ``superagent`` entry point: names each command group and imports it when used."""

from __future__ import annotations

import importlib

import click

from controlplane import __version__

# Each command's module, imported only when that command runs (or help lists it): importing
# them all costs about 2 s of CPU (openai, sqlalchemy, the router's and workers' modules),
# paid by every `superagent` call, while most commands need a fraction of it.
COMMANDS = {
    "up": "controlplane.cli.up:up",
    "serve": "controlplane.cli.up:serve_command",
    "migrate": "controlplane.cli.db:migrate",
    "config": "controlplane.cli.config:config",
    "devices": "controlplane.cli.devices:devices",
    "status": "controlplane.cli.status:status",
    "pause": "controlplane.cli.pausing:pause",
    "resume": "controlplane.cli.pausing:resume",
    "policy": "controlplane.cli.versioned:policy",
    "prompts": "controlplane.cli.versioned:prompts_group",
    "users": "controlplane.cli.users:users",
    "tickets": "controlplane.cli.tickets:tickets",
    "triggers": "controlplane.cli.triggers:triggers",
    "watchdog": "controlplane.cli.watchdog:watchdog",
    "say": "controlplane.cli.say:say",
    "doctor": "controlplane.cli.doctor:doctor",
    "effects": "controlplane.cli.effects:effects",
}


class _LazyGroup(click.Group):
    """A group whose commands are imported by name, from :data:`COMMANDS`, when used."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, _, attribute = COMMANDS[cmd_name].partition(":")
            command = getattr(importlib.import_module(module), attribute)
            if not isinstance(command, click.Command):
                raise TypeError(f"{COMMANDS[cmd_name]} is not a click command")
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="superagent")
def cli() -> None:
    """Super-agent: the always-on coding agent for your team.

    People talk to the agent in GitHub, chat and the web console; the control plane routes
    their requests, and paired devices (endpointd) run the work where the code lives.

    Start here: `superagent up` runs everything on this machine with an embedded database.
    Configuration comes from the environment; `superagent config` shows it.
    """


def main() -> None:
    cli(prog_name="superagent")
