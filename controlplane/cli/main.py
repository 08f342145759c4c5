"""The ``superagent`` entry point: registers each command group."""

from __future__ import annotations

import click

from controlplane import __version__
from controlplane.cli.config import config
from controlplane.cli.db import migrate
from controlplane.cli.devices import devices
from controlplane.cli.doctor import doctor
from controlplane.cli.effects import effects
from controlplane.cli.pausing import pause, resume
from controlplane.cli.say import say
from controlplane.cli.status import status
from controlplane.cli.tickets import tickets
from controlplane.cli.triggers import triggers
from controlplane.cli.up import serve_command, up
from controlplane.cli.users import users
from controlplane.cli.versioned import policy, prompts_group
from controlplane.cli.watchdog import watchdog


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="superagent")
def cli() -> None:
    """Super-agent: the always-on coding agent for your team.

    People talk to the agent in GitHub, chat and the web console; the control plane routes
    their requests, and paired devices (endpointd) run the work where the code lives.

    Start here: `superagent up` runs everything on this machine with an embedded database.
    Configuration comes from the environment; `superagent config` shows it.
    """


cli.add_command(up)
cli.add_command(serve_command, name="serve")
cli.add_command(migrate)
cli.add_command(config)
cli.add_command(devices)
cli.add_command(status)
cli.add_command(pause)
cli.add_command(resume)
cli.add_command(policy)
cli.add_command(prompts_group)
cli.add_command(users)
cli.add_command(tickets)
cli.add_command(triggers)
cli.add_command(watchdog)
cli.add_command(say)
cli.add_command(doctor)
cli.add_command(effects)


def main() -> None:
    cli(prog_name="superagent")
