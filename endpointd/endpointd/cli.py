"""The `endpointd` command line: one function per command, one place that prints errors.

Every expected failure is an :class:`EndpointdError`, printed as one line (``Error: ...``)
with exit status 1 and no traceback. Heavy or slow imports (gRPC, keyring probing D-Bus on
Linux) happen inside the commands that need them, so `endpointd --help` and `endpointd
version` stay instant.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import sys
from pathlib import Path
from typing import Any

import click

from endpointd import __version__
from endpointd.errors import EndpointdError
from endpointd.keys import KeyringStatus, keyring_status
from endpointd.paths import config_dir, state_dir
from superagent_shared.protocol import PROTOCOL_VERSION, PROTOCOL_VERSION_NUMBER

__all__ = ["KeyringStatus", "cli", "keyring_status", "main"]


class _Group(click.Group):
    """Turns EndpointdError into click's one-line error and exit status 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except EndpointdError as exc:
            raise click.ClickException(str(exc)) from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(
    __version__,
    prog_name="endpointd",
    message=f"%(prog)s %(version)s (protocol {PROTOCOL_VERSION})",
)
def cli() -> None:
    """endpointd: the super-agent device daemon.

    endpointd lets your team's coding agent work in this machine's real environment: it
    runs the commands and file operations the control plane sends, hands them credentials
    from your OS keyring without ever sending the secret values upstream, and enforces a
    local policy file that only you can change. It only ever connects out to the control
    plane, over a single TLS-protected gRPC stream; it never listens for or accepts inbound
    connections, so it needs no open ports and works behind NAT and firewalls.

    Start with `endpointd pair URL CODE`, then `endpointd run` (or `endpointd service
    install --now` to start it at every login), and check on it with `endpointd status`.
    """


@cli.command()
def version() -> None:
    """Print the daemon version and the wire protocol it speaks."""
    click.echo(f"endpointd {__version__}")
    click.echo(f"protocol {PROTOCOL_VERSION} (version {PROTOCOL_VERSION_NUMBER})")


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def info(as_json: bool) -> None:
    """Show the config and state directories and whether the OS keyring is usable.

    Pairing stores the device key in the keyring, so check this first. Set
    ENDPOINTD_CONFIG_DIR or ENDPOINTD_STATE_DIR to use different directories.
    """
    cfg = config_dir()
    state = state_dir()
    ring = keyring_status()
    report: dict[str, Any] = {
        "version": __version__,
        "protocol_version": PROTOCOL_VERSION,
        "protocol_version_number": PROTOCOL_VERSION_NUMBER,
        "config_dir": str(cfg.path),
        "config_dir_source": cfg.source,
        "config_dir_exists": cfg.path.is_dir(),
        "state_dir": str(state.path),
        "state_dir_source": state.source,
        "keyring": {
            "backend": ring.backend,
            "class": ring.backend_class,
            "usable": ring.usable,
            "detail": ring.detail,
        },
    }
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return

    exists = "exists" if report["config_dir_exists"] else "not created yet"
    click.echo(f"endpointd {__version__} (protocol {PROTOCOL_VERSION})")
    click.echo(f"config dir: {cfg.path}  [{cfg.source}; {exists}]")
    click.echo(f"state dir:  {state.path}  [{state.source}]")
    usable = "usable" if ring.usable else "NOT usable"
    where = f" ({ring.backend_class})" if ring.backend_class else ""
    click.echo(f"keyring:    {ring.backend}{where}: {usable}, {ring.detail}")
    if not ring.usable:
        # Say what to do, not just what is wrong: pairing stores the device's private key in
        # the keyring, so an unusable one blocks pairing.
        click.echo(
            "            install or unlock an OS keyring (Secret Service/KWallet on Linux,"
            " Keychain on macOS, Credential Locker on Windows) before pairing,"
            " or pair with --key-file PATH"
        )


@cli.command()
@click.argument("url")
@click.argument("code")
@click.option("--name", help="Device name shown to your team (default: this machine's hostname).")
@click.option(
    "--key-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Keep the private key in this 0600 file instead of the OS keyring.",
)
@click.option(
    "--fingerprint",
    help="Expected SHA-256 of the server certificate (hex; colons and a sha256: prefix are fine).",
)
def pair(
    url: str, code: str, name: str | None, key_file: Path | None, fingerprint: str | None
) -> None:
    """Pair this machine with a control plane, using a one-time CODE.

    URL is the device gateway, normally https://HOST:PORT (http:// is accepted for loopback
    addresses only). An admin or the owner gets the 8-character CODE from the console or
    from chat; it works once, for 10 minutes. Pairing creates an Ed25519 key whose private
    half stays in your OS keyring (or in a 0600 --key-file), registers the public half, and
    pins the server's certificate: if the server uses its own CA, that CA becomes the only
    one trusted for it, so pass --fingerprint (shown to the admin) to rule out interception
    on this first connection.
    """
    from endpointd.pairing import pair as do_pair
    from superagent_shared.gateway_tls import format_fingerprint, parse_fingerprint

    expected: bytes | None = None
    if fingerprint is not None:
        try:
            expected = parse_fingerprint(fingerprint)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--fingerprint") from None
    config = do_pair(
        url=url,
        code=code,
        device_name=name,
        key_file=key_file,
        fingerprint=expected,
        config_directory=config_dir().path,
    )
    where = "OS keyring" if config.key.storage == "keyring" else config.key.path
    click.echo(
        f"paired with {config.server_name or config.server_url} as {config.device_id}"
        f" ({config.device_name})"
    )
    if config.trust.mode == "pinned":
        leaf = format_fingerprint(bytes.fromhex(config.trust.leaf_sha256))
        click.echo(f"server certificate pinned: {leaf}")
    click.echo(f"device key: {where}")
    click.echo("next: `endpointd run`, or `endpointd service install --now` to start at login")


@cli.command()
@click.option(
    "--max-runtime",
    type=click.IntRange(min=1),
    help="Cap on any command's run time in seconds; also the limit when a command sets none"
    " (default: the config's default_timeout_seconds, 3600).",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
)
def run(max_runtime: int | None, log_level: str) -> None:
    """Run the daemon in the foreground: connect, execute commands, reconnect forever.

    Dials the paired control plane and keeps one stream open, retrying with backoff (1 s
    growing to 2 minutes) whenever it drops. Every command is journaled before it runs, so
    a redelivery never runs twice; running commands keep going across disconnects and even
    across a restart of this daemon, and their output is resent from where the server left
    off. Stop it with Ctrl-C or SIGTERM. Logs go to stderr; `endpointd status` shows what it
    is doing.
    """
    import asyncio

    from endpointd.runner import run_daemon

    if sys.platform == "win32":
        raise EndpointdError(
            "`endpointd run` needs POSIX process groups; Windows is not supported yet"
        )
    logging.basicConfig(
        level=log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # gRPC's own INFO chatter about reconnects would drown ours.
    logging.getLogger("grpc").setLevel(logging.WARNING)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(
            run_daemon(
                config_directory=config_dir().path,
                state_directory=state_dir().path,
                max_timeout_seconds=max_runtime,
            )
        )


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def status(as_json: bool) -> None:
    """Show where this device is paired, whether the daemon is connected, and what runs.

    Reads the config, the running daemon's status file (checking that its process is still
    alive) and the command journal; it never contacts the server, so it answers instantly
    even when the network is down. The last connection error is shown, e.g. when the server
    has revoked this device.
    """
    from endpointd.report import collect_status, print_status

    report = collect_status(config_dir().path, state_dir().path)
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        print_status(report)


@cli.command()
@click.option("--purge", is_flag=True, help="Also delete the command journal and output spools.")
def unpair(purge: bool) -> None:
    """Forget the pairing: delete the device key and the config.

    The private key is removed from the OS keyring (or its key file deleted), so this
    machine can no longer act as the device. The command journal is kept (it is the record
    of what ran here) unless --purge is given. The server still lists the device until an
    admin revokes it. Stop the daemon first.
    """
    from endpointd.config import delete_config, load_config
    from endpointd.keys import delete_key
    from endpointd.report import daemon_alive

    cfg_dir, st_dir = config_dir().path, state_dir().path
    config = load_config(cfg_dir)
    pid = daemon_alive(st_dir)
    if pid is not None:
        raise EndpointdError(
            f"endpointd is running (pid {pid}); stop it first (e.g. `systemctl --user stop"
            " endpointd`), then unpair"
        )
    removed = delete_key(config.key)
    delete_config(cfg_dir)
    where = "OS keyring" if config.key.storage == "keyring" else config.key.path
    click.echo(f"unpaired {config.device_id} from {config.server_name or config.server_url}")
    click.echo(f"device key {'deleted from' if removed else 'was already gone from'} {where}")
    if purge:
        shutil.rmtree(st_dir, ignore_errors=True)
        click.echo(f"journal and spools deleted ({st_dir})")
    click.echo("the server still lists this device until an admin revokes it")


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
def service_install(now: bool) -> None:
    """Write the service file (and with --now enable and start it)."""
    from endpointd.service import install

    installed = install(now=now)
    click.echo(f"wrote {installed.path}")
    if now:
        click.echo("started: " + " ".join(installed.enable))
    else:
        click.echo("start it now and at every login with: " + " ".join(installed.enable))


@service.command("uninstall")
@click.option("--now", is_flag=True, help="Also stop and disable it first.")
def service_uninstall(now: bool) -> None:
    """Remove the service file (and with --now stop and disable it first)."""
    from endpointd.service import uninstall

    removed, existed = uninstall(now=now)
    if not existed:
        click.echo(f"nothing to remove: {removed.path} does not exist")
        return
    click.echo(f"removed {removed.path}")
    if not now:
        click.echo("if it is running, stop it with: " + " ".join(removed.disable))


def main() -> None:
    """Console-script entry point (`endpointd = endpointd.cli:main`)."""
    # A fixed prog_name keeps usage lines reading `endpointd …` under `python -m endpointd`.
    cli(prog_name="endpointd")
