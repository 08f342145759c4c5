"""`endpointd sandbox check`: try to escape this machine's sandbox, under your own policy."""

from __future__ import annotations

import json
import textwrap

import click

from endpointd.cli.root import cli, json_option
from endpointd.paths import config_dir, data_dir, state_dir

# Exit statuses: every class contained (or allowed by the policy); a class escaped. An
# error that stops the check (no usable policy, a sandbox this machine cannot apply) is 1,
# as for every command.
EXIT_CONTAINED = 0
EXIT_ESCAPED = 3


@cli.group("sandbox")
def sandbox_group() -> None:
    """Check the sandbox that confines the commands this device runs.

    `endpointd sandbox check` tries to escape it here, under your own policy, and says per
    class of escape whether it held; it is safe to run (see its --help).
    """


@sandbox_group.command("check")
@json_option()
@click.pass_context
def sandbox_check(ctx: click.Context, as_json: bool) -> None:
    """Try to escape the sandbox here, under your policy, and say what held.

    Runs a built-in suite of escape probes as one command, through the same executor and
    sandbox the daemon uses for the control plane's commands (not a simulation), and
    prints per class `contained` or `escaped`, with the fix for each that escaped (the
    policy key, or what this machine or endpointd lacks). The classes: persistence (shell
    start-up files, autostart entries and user units, ~/.local/bin, the git hooks and
    config of a checkout), sockets (Unix sockets outside the grants, an ssh-agent's, the
    control plane's), egress (TCP and UDP beyond the policy's network mode), reads
    (credential locations, endpointd's and the control plane's state), cross-workspace
    (another ticket's workspace and branch, the owner's branch, a terminal of yours),
    processes (signalling another process, reading its environment) and privileges
    (capabilities, setuid, device nodes).

    It is safe to run, on your own machine, while the daemon runs: the probes aim only at
    what the check plants first and removes after, all named endpointd-sandbox-check-*
    or endpointd-check-* (canary files inside ~/.ssh, ~/.aws and the like, sockets and
    listeners it starts itself, a scratch checkout with two ticket worktrees, a pty, a
    process of its own). It never opens, prints or changes a file of yours: an existing
    ~/.bashrc is opened for writing and closed, nothing written. Nothing leaves the
    machine (the listeners are its own). It takes a few seconds.

    The result is kept in the state dir: `endpointd status` shows it, and so does
    `superagent doctor` for the machine's own device. Exit status: 0 when every class is
    contained (or allowed by the policy, such as egress under network = "allow"), 3 when
    one escaped, 1 when the check cannot run (it says why).
    """
    from endpointd.guard.policy import load_policy
    from endpointd.sandboxcheck.check import run_check

    config, state, data = config_dir().path, state_dir().path, data_dir().path
    policy = load_policy(config, state_directory=state, data_directory=data)
    result = run_check(policy, config_directory=config, state_directory=state, data_directory=data)
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
    else:
        click.echo(f"policy:  {policy.path} (sha256 {result.policy_sha256[:12]}…)")
        click.echo(f"sandbox: {result.sandbox}")
        width = max(len(c.name) for c in result.classes)
        indent = " " * (width + 6)

        def say(text: str) -> None:
            click.echo(textwrap.fill(text, 100, initial_indent=indent, subsequent_indent=indent))

        for c in result.classes:
            words = {"allowed": "allowed by the policy", "error": "not checked"}
            click.echo(f"  {c.name:<{width}}  {words.get(c.outcome, c.outcome)}")
            for what in c.escaped:
                say(f"escaped: {what}")
            if c.detail:
                say(c.detail)
            if c.fix:
                say(f"fix: {c.fix}")
        if result.escaped:
            click.echo(f"escaped: {', '.join(result.escaped)}")
        elif result.errors:
            click.echo(f"could not check: {', '.join(result.errors)}")
        else:
            click.echo("every class contained")
    if result.errors and not result.escaped:
        ctx.exit(1)
    ctx.exit(EXIT_ESCAPED if result.escaped else EXIT_CONTAINED)
