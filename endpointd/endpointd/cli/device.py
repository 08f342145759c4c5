"""`endpointd version`, `info`, `pair`, `run`, `status` and `unpair`: this device and its link."""

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
from endpointd.cli.root import cli, echo_json, json_option
from endpointd.errors import EndpointdError
from endpointd.keys import keyring_status
from endpointd.paths import config_dir, data_dir, state_dir
from endpointd.rules.terms import NETWORK_MODES, NetworkMode
from superagent_shared.protocol import PROTOCOL_VERSION, PROTOCOL_VERSION_NUMBER


@cli.command()
@json_option()
def version(as_json: bool) -> None:
    """Print the daemon version and the wire protocol it speaks."""
    if as_json:
        echo_json(
            {
                "version": __version__,
                "protocol_version": PROTOCOL_VERSION,
                "protocol_version_number": PROTOCOL_VERSION_NUMBER,
            }
        )
        return
    click.echo(f"endpointd {__version__}")
    click.echo(f"protocol {PROTOCOL_VERSION} (version {PROTOCOL_VERSION_NUMBER})")


@cli.command()
@json_option()
def info(as_json: bool) -> None:
    """Show the config, state and data directories and whether the OS keyring is usable.

    Pairing stores the device key in the keyring, so check this first. Set
    ENDPOINTD_CONFIG_DIR, ENDPOINTD_STATE_DIR or ENDPOINTD_DATA_DIR (the tickets'
    workspaces) to use different directories.
    """
    cfg = config_dir()
    state = state_dir()
    data = data_dir()
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
        "data_dir": str(data.path),
        "data_dir_source": data.source,
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
    click.echo(f"data dir:   {data.path}  [{data.source}; the tickets' workspaces]")
    usable = "usable" if ring.usable else "NOT usable"
    where = f" ({ring.backend_class})" if ring.backend_class else ""
    click.echo(f"keyring:    {ring.backend}{where}: {usable}, {ring.detail}")
    if not ring.usable:
        # Say what to do, not just what is wrong: pairing stores the device's private key in
        # the keyring, so an unusable one blocks pairing.
        click.echo(
            "            install or unlock an OS keyring (Secret Service/KWallet on Linux,"
            " Keychain on macOS, Credential Locker on Windows) before pairing,"
            " or pair with --key-file PATH; credentials then go to files:"
            " `endpointd creds add NAME --store file`"
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
@click.option(
    "--allow-root",
    "allow_roots",
    multiple=True,
    metavar="DIR",
    help="A directory commands and file operations may use (repeatable). Asked for"
    " interactively when omitted; required when stdin is not a terminal.",
)
@click.option(
    "--network",
    type=click.Choice(NETWORK_MODES),
    default=None,
    help="The network mode of a policy file pairing creates (default: the example's,"
    ' "allow"); an existing policy file is never changed.',
)
@json_option()
def pair(
    url: str,
    code: str,
    name: str | None,
    key_file: Path | None,
    fingerprint: str | None,
    allow_roots: tuple[str, ...],
    network: NetworkMode | None,
    as_json: bool,
) -> None:
    """Pair this machine with a control plane, using a one-time CODE.

    URL is the device gateway, normally https://HOST:PORT (http:// is accepted for loopback
    addresses only). An admin or the owner gets the 8-character CODE from the console or
    from chat; it works once, for 10 minutes. Pairing creates an Ed25519 key whose private
    half stays in your OS keyring (or in a 0600 --key-file), registers the public half, and
    pins the server's certificate: if the server uses its own CA, that CA becomes the only
    one trusted for it, so pass --fingerprint (shown to the admin) to rule out interception
    on this first connection.

    endpointd only works inside directories you allow: pairing asks for at least one (or
    takes --allow-root DIR, repeatable) and writes them into the local policy file
    (policy.toml in the config dir, see `endpointd policy show`), unless that file already
    lists some.

    \b
    Example:
      endpointd pair https://gw.example.com:8443 K7QM2XPA --fingerprint sha256:AB:… \\
          --allow-root ~/src
    """
    from endpointd.link.pairing import check_not_paired
    from endpointd.link.pairing import pair as do_pair
    from superagent_shared.gateway_tls import format_fingerprint, parse_fingerprint

    expected: bytes | None = None
    if fingerprint is not None:
        try:
            expected = parse_fingerprint(fingerprint)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--fingerprint") from None
    cfg = config_dir().path
    check_not_paired(cfg)
    roots = _roots_for_pairing(cfg, allow_roots)
    config = do_pair(
        url=url,
        code=code,
        device_name=name,
        key_file=key_file,
        fingerprint=expected,
        config_directory=cfg,
        allowed_roots=roots,
        network=network,
    )
    where = "OS keyring" if config.key.storage == "keyring" else config.key.path
    if as_json:
        # Where the key is kept, never the key; the certificate's fingerprint is public.
        echo_json(
            {
                "paired": True,
                "device_id": config.device_id,
                "device_name": config.device_name,
                "url": config.server_url,
                "server_name": config.server_name,
                "trust": config.trust.mode,
                "certificate_sha256": config.trust.leaf_sha256 or None,
                "key_storage": config.key.storage,
                "key_file": config.key.path or None,
                "policy": str(cfg / "policy.toml"),
                "allowed_roots": [str(r) for r in roots] if roots else None,
            }
        )
        return
    click.echo(
        f"paired with {config.server_name or config.server_url} as {config.device_id}"
        f" ({config.device_name})"
    )
    if config.trust.mode == "pinned":
        leaf = format_fingerprint(bytes.fromhex(config.trust.leaf_sha256))
        click.echo(f"server certificate pinned: {leaf}")
    click.echo(f"device key: {where}")
    if roots:
        listed = ", ".join(str(r) for r in roots)
        click.echo(f"policy: {cfg / 'policy.toml'} (allowed roots: {listed})")
    else:
        click.echo(f"policy: {cfg / 'policy.toml'} (kept as it is; `endpointd policy show`)")
    click.echo("next: `endpointd run`, or `endpointd service install --now` to start at login")


def _roots_for_pairing(cfg: Path, given: tuple[str, ...]) -> list[Path] | None:
    """The roots pairing must write into the policy, or None when it already has some.

    Settled before the pairing code is spent, so a typo or a refusal costs nothing.
    """
    import os

    from endpointd.rules.terms import POLICY_FILE
    from endpointd.rules.writer import allowed_root, roots_state

    state, current = roots_state(cfg)
    roots = [allowed_root(raw) for raw in given]
    if state == "set":
        known = {os.path.realpath(p) for p in current}
        extra = [str(r) for r in roots if os.path.realpath(r) not in known]
        if extra:
            raise EndpointdError(
                f"{cfg / POLICY_FILE} already lists allowed roots"
                f" ({', '.join(str(p) for p in current)}); add {', '.join(extra)} to"
                " allowed_roots there, or pair without --allow-root"
            )
        return None
    if roots:
        return roots
    if not sys.stdin.isatty():
        raise EndpointdError(
            "endpointd needs at least one directory it may work in: pass --allow-root DIR"
            " (repeatable), e.g. `endpointd pair URL CODE --allow-root ~/src`"
        )
    click.echo(
        "endpointd runs commands and reads or writes files only inside directories you"
        " allow (kept in policy.toml; `endpointd policy show` explains it).",
        err=True,
    )
    while True:
        prompt = "Directory to allow" if not roots else "Another directory (empty to finish)"
        raw = click.prompt(prompt, default="", show_default=False, err=True)
        if not raw.strip():
            if roots:
                return roots
            click.echo("  at least one directory is needed", err=True)
            continue
        try:
            roots.append(allowed_root(raw))
        except EndpointdError as exc:
            click.echo(f"  {exc}", err=True)


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
@click.option(
    "--parent-pid",
    type=int,
    hidden=True,
    help="Stop when this process is no longer our parent (`superagent up --device` uses it).",
)
@json_option(
    "Machine-readable output: log lines as JSON, one object per line (time, level, logger,"
    " message; the control plane's SUPERAGENT_LOG_FORMAT=json)."
)
def run(max_runtime: int | None, log_level: str, parent_pid: int | None, as_json: bool) -> None:
    """Run the daemon in the foreground: connect, execute commands, reconnect forever.

    Dials the paired control plane and keeps one stream open, retrying with backoff (1 s
    growing to 2 minutes) whenever it drops. Every command is journaled before it runs, so
    a redelivery never runs twice; running commands keep going across disconnects and even
    across a restart of this daemon, and their output is resent from where the server left
    off. Stop it with Ctrl-C or SIGTERM. Logs go to stderr, as text or with --json as one
    JSON object per line (nothing goes to stdout); `endpointd status` shows what it is doing.
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
    if as_json:
        from superagent_shared.log_json import JsonFormatter

        for handler in logging.getLogger().handlers:
            handler.setFormatter(JsonFormatter())
    # gRPC's own INFO chatter about reconnects would drown ours.
    logging.getLogger("grpc").setLevel(logging.WARNING)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(
            run_daemon(
                config_directory=config_dir().path,
                state_directory=state_dir().path,
                max_timeout_seconds=max_runtime,
                parent_pid=parent_pid,
            )
        )


@cli.command()
@json_option()
def status(as_json: bool) -> None:
    """Show where this device is paired, whether the daemon is connected, what runs, how
    commands are sandboxed (and the last `endpointd sandbox check`), and which store holds
    the credentials.

    Reads the config, the running daemon's status file (checking that its process is still
    alive) and the command journal; it never contacts the server, so it answers instantly
    even when the network is down. The last connection error is shown, e.g. when the server
    has revoked this device.
    """
    from endpointd.status import (
        collect_status,
        credential_line,
        credential_status,
        print_status,
        sandbox_check_status,
        sandbox_status,
    )

    report = collect_status(config_dir().path, state_dir().path)
    report["sandbox"], report["sandbox_from"] = sandbox_status(
        config_dir().path, state_dir().path, running=report["daemon"]["running"]
    )
    check_line, report["sandbox_check"] = sandbox_check_status(config_dir().path, state_dir().path)
    report["credentials"] = credential_status(config_dir().path, state_dir().path)
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        print_status(report)
        source = "" if report["sandbox_from"] == "daemon" else " (from the policy file)"
        click.echo(f"sandbox:   {report['sandbox']}{source}")
        click.echo(f"sandbox check: {check_line}")
        click.echo(credential_line(report["credentials"]))


@cli.command()
@click.option("--purge", is_flag=True, help="Also delete the command journal and output spools.")
@json_option()
def unpair(purge: bool, as_json: bool) -> None:
    """Forget the pairing: delete the device key and the config.

    The private key is removed from the OS keyring (or its key file deleted), so this
    machine can no longer act as the device. The command journal is kept (it is the record
    of what ran here) unless --purge is given. The server still lists the device until an
    admin revokes it. Stop the daemon first.
    """
    from endpointd.config import delete_config, load_config
    from endpointd.keys import delete_key
    from endpointd.status import daemon_alive

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
    if purge:
        shutil.rmtree(st_dir, ignore_errors=True)
    if as_json:
        echo_json(
            {
                "unpaired": True,
                "device_id": config.device_id,
                "url": config.server_url,
                "server_name": config.server_name,
                "key_storage": config.key.storage,
                "key_file": config.key.path or None,
                "key_deleted": removed,
                "purged": str(st_dir) if purge else None,
            }
        )
        return
    where = "OS keyring" if config.key.storage == "keyring" else config.key.path
    click.echo(f"unpaired {config.device_id} from {config.server_name or config.server_url}")
    click.echo(f"device key {'deleted from' if removed else 'was already gone from'} {where}")
    if purge:
        click.echo(f"journal and spools deleted ({st_dir})")
    click.echo("the server still lists this device until an admin revokes it")
