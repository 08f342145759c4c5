"""The ``superagent`` entry point: names each command group and imports it when used."""

from __future__ import annotations

import importlib

import click

from controlplane import __version__
from controlplane.cli.contexts import META as CONTEXT_META
from superagent_shared.cli_errors import run

# Each command: its module, imported only when that command runs, and the one line `superagent
# --help` lists it with. Listing the commands must not import them: importing them all costs
# about 2 s of CPU (openai, sqlalchemy, the router's and workers' modules), which every
# `superagent --help` paid. The line given here is the command's own short help once it is
# loaded too, so the two cannot differ.
COMMANDS: dict[str, tuple[str, str]] = {
    "up": ("controlplane.cli.up:up", "Run the whole control plane on this machine."),
    "serve": ("controlplane.cli.up:serve_command", "Run one replica of a deployment."),
    "migrate": ("controlplane.cli.db:migrate", "Upgrade the database schema to this release."),
    "config": ("controlplane.cli.config:config", "Show the effective configuration."),
    "devices": (
        "controlplane.cli.devices:devices",
        "Pair, list and revoke devices (machines running endpointd).",
    ),
    "status": (
        "controlplane.cli.status:status",
        "Show the replicas, the router, tickets, devices and findings.",
    ),
    "pause": ("controlplane.cli.pausing:pause", "Pause the agent; events wait."),
    "resume": ("controlplane.cli.pausing:resume", "Resume after `superagent pause`."),
    "admission": (
        "controlplane.cli.versioned:policy",
        "Show and edit who may ask the agent for work.",
    ),
    "prompts": (
        "controlplane.cli.versioned:prompts_group",
        "Show and edit the system prompts (router, worker, watchdog).",
    ),
    "users": ("controlplane.cli.users:users", "Link a person's accounts across channels."),
    "tickets": (
        "controlplane.cli.tickets:tickets",
        "See and steer tickets: the work people asked for.",
    ),
    "triggers": (
        "controlplane.cli.triggers:triggers",
        "See the router's inbox; put back what it set aside.",
    ),
    "watchdog": (
        "controlplane.cli.watchdog:watchdog",
        "Watch the deployment from outside the replicas, and act.",
    ),
    "say": ("controlplane.cli.say:say", "Say something to the agent and print its replies."),
    "doctor": (
        "controlplane.cli.doctor:doctor",
        "Check the configuration, database, gateway, channels and model.",
    ),
    "effects": (
        "controlplane.cli.effects:effects",
        "The outbox: external actions, and retrying the dead ones.",
    ),
    "login": (
        "controlplane.cli.login:login",
        "Manage a deployed control plane from here, over its API.",
    ),
    "logout": ("controlplane.cli.login:logout", "Forget a context and its token."),
    "context": (
        "controlplane.cli.login:context",
        "List the contexts, and choose which deployment to manage.",
    ),
    "tokens": (
        "controlplane.cli.tokens:tokens",
        "Named API tokens: who acts over the HTTP API.",
    ),
    "completion": (
        "superagent_shared.completion:completion",
        "Print the script that completes this program's commands in SHELL.",
    ),
}


# Old names that still work, neither listed nor taught.
ALIASES = {"policy": "admission"}


class _LazyGroup(click.Group):
    """A group whose commands are imported by name, from :data:`COMMANDS`, when used, and
    listed by the help without being imported."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        cmd_name = ALIASES.get(cmd_name, cmd_name)
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            target, summary = COMMANDS[cmd_name]
            module, _, attribute = target.partition(":")
            command = getattr(importlib.import_module(module), attribute)
            if not isinstance(command, click.Command):
                raise TypeError(f"{target} is not a click command")
            command.short_help = summary
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            if name in self.commands:
                command = self.commands[name]
                if command.hidden:
                    continue
                rows.append((name, command.get_short_help_str(formatter.width)))
            else:
                rows.append((name, COMMANDS[name][1]))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _keep_context(ctx: click.Context, _: click.Parameter, value: str | None) -> None:
    ctx.meta[CONTEXT_META] = value


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="superagent")
@click.option(
    "--context",
    metavar="NAME",
    expose_value=False,
    is_eager=True,
    callback=_keep_context,
    help="The deployment to manage over HTTP (superagent login); 'local': the database. "
    "[default: SUPERAGENT_CONTEXT, else the current context, else the database]",
)
def cli() -> None:
    """Super-agent: the always-on coding agent for your team.

    People talk to the agent in GitHub, chat and the web console; the control plane routes
    their requests, and paired devices (endpointd) run the work where the code lives.

    Start here: `superagent up` runs everything on this machine with an embedded database.
    Configuration comes from the environment; `superagent config` shows it. To manage a
    deployment elsewhere: `superagent login URL`, then the same commands.
    """


def main() -> None:
    run(cli, "superagent")
