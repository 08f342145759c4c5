"""`endpointd service install|uninstall`: endpointd as a per-user service started at login."""

from __future__ import annotations

import click

from endpointd.cli.root import cli, echo_json, json_option


@cli.group()
def service() -> None:
    """Install endpointd as a per-user service that starts at login.

    On Linux this writes a systemd user unit (~/.config/systemd/user/endpointd.service), on
    macOS a launchd agent (~/Library/LaunchAgents/dev.superagent.endpointd.plist), both
    running `endpointd run` with this Python and restarting it if it exits. The follow-up
    command is printed rather than run, unless you pass --now. ENDPOINTD_SERVICE_DIR
    overrides the target directory.
    """


@service.command("install")
@click.option("--now", is_flag=True, help="Also enable and start it right away.")
@json_option()
def service_install(now: bool, as_json: bool) -> None:
    """Write the service file (and with --now enable and start it)."""
    from endpointd.autostart import install

    installed = install(now=now)
    if as_json:
        echo_json(
            {
                "installed": True,
                "path": str(installed.path),
                "started": now,
                "enable": installed.enable,
            }
        )
        return
    click.echo(f"wrote {installed.path}")
    if now:
        click.echo("started: " + " ".join(installed.enable))
    else:
        click.echo("start it now and at every login with: " + " ".join(installed.enable))


@service.command("uninstall")
@click.option("--now", is_flag=True, help="Also stop and disable it first.")
@json_option()
def service_uninstall(now: bool, as_json: bool) -> None:
    """Remove the service file (and with --now stop and disable it first)."""
    from endpointd.autostart import uninstall

    removed, existed = uninstall(now=now)
    if as_json:
        echo_json(
            {
                "removed": existed,
                "path": str(removed.path),
                "stopped": now and existed,
                "disable": removed.disable,
            }
        )
        return
    if not existed:
        click.echo(f"nothing to remove: {removed.path} does not exist")
        return
    click.echo(f"removed {removed.path}")
    if not now:
        click.echo("if it is running, stop it with: " + " ".join(removed.disable))
