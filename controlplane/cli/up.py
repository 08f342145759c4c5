"""``superagent up`` (everything on this machine) and ``superagent serve`` (one replica)."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import click

from controlplane import listening, logs
from controlplane.access import admin_token
from controlplane.cli.common import (
    clear_errors,
    load_settings,
    run_until_signalled,
    say,
    setup_logging,
)
from controlplane.db.database import open_database
from controlplane.errors import ConfigError
from controlplane.gateway.local_device import (
    LocalDeviceRequest,
    default_device_name,
    device_home,
    paired_devices,
)
from controlplane.settings import Settings


def _settings(
    state_dir: Path | None, http_port: int | None, grpc_port: int | None
) -> tuple[Settings, bool]:
    """The server's settings, and whether its admin token was generated (not configured)."""
    settings = load_settings(state_dir=state_dir)
    if http_port is not None:
        settings.http = settings.http.model_copy(update={"port": http_port})
    if grpc_port is not None:
        settings.grpc = settings.grpc.model_copy(update={"port": grpc_port})
    with clear_errors():
        clash = listening.clash(
            (settings.http.host, settings.http.port), (settings.grpc.host, settings.grpc.port)
        )
        if clash is not None:
            raise ConfigError(clash)
        # Before anything starts: a server beyond loopback without a token never listens.
        return admin_token.for_server(settings), settings.admin_token is None


_state_dir = click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Local state (embedded database, certificates). [env SUPERAGENT_STATE_DIR]",
)
_http_port = click.option("--http-port", type=int, help="HTTP port. [env SUPERAGENT_HTTP__PORT]")
_grpc_port = click.option("--grpc-port", type=int, help="gRPC port. [env SUPERAGENT_GRPC__PORT]")


def _json_logs(ctx: click.Context, _: click.Parameter, value: bool) -> None:
    # In the environment, so the children (the watchdog, the local endpointd's supervisor)
    # log the same way: a server's output is its log.
    if value:
        os.environ[logs.FORMAT_ENV] = "json"


# A server's machine-readable output is its log: one JSON object per line.
_json = click.option(
    "--json",
    "as_json",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_json_logs,
    help="Log lines as JSON objects, one per line. [env SUPERAGENT_LOG_FORMAT=json]",
)


def _announce_link(settings: Settings) -> Callable[[str], None]:
    where = admin_token.token_path(settings)

    def announce(url: str) -> None:
        say(
            f"Sign in to the console: {url}\n"
            f"  (a one-time link, valid for an hour; the admin token is in {where})"
        )

    return announce


def _run(
    settings: Settings,
    *,
    apply_migrations: bool,
    link: bool,
    watchdog: bool,
    device: DeviceChoice | None = None,
    log_file: bool = False,
) -> None:
    setup_logging(settings.log_level)
    if log_file:
        log_path = logs.log_to_file(settings.state_dir)
        say(f"State: {settings.state_dir} · log: {log_path}")
    # Imported here: the runtime pulls in uvicorn, grpc and openai, which every other
    # command (`superagent say`, `status`, ...) would otherwise pay for at start.
    from controlplane.runtime import serve

    async def main(stop: asyncio.Event) -> None:
        with clear_errors(), open_database(settings) as database:
            where = "embedded Postgres" if database.embedded else "DATABASE_URL"
            say(
                f"Super-agent on http://{settings.http.host}:{settings.http.port} "
                f"(devices: {settings.grpc.host}:{settings.grpc.port}, database: {where}). "
                + (
                    f"Chat: http://{settings.http.host}:{settings.http.port}/chat. "
                    if settings.webchat.enabled
                    else ""
                )
                + "Ctrl-C stops."
            )
            local = await _local_device(settings, database.url, device) if device else None
            if device is not None and local is None:
                await _next_steps(settings, database.url)
            announce = _announce_link(settings) if link else None
            await serve(
                settings,
                database.url,
                stop,
                apply_migrations=apply_migrations,
                announce=announce,
                watchdog_child=watchdog,
                local_device=local,
            )

    run_until_signalled(main, shutdown_timeout=settings.shutdown_timeout_seconds)


@dataclass(frozen=True)
class DeviceChoice:
    """What `up` was told about this machine as a device."""

    root: Path | None  # --device DIR
    name: str | None  # --device-name
    refused: bool  # --no-device
    interactive: bool  # may ask the one question


async def _local_device(
    settings: Settings, database_url: str, choice: DeviceChoice
) -> LocalDeviceRequest | None:
    """This machine's device, if it is (or is now asked to become) one."""
    if choice.refused:
        return None
    root = choice.root
    paired = device_home(settings).paired  # then its policy keeps the allowed roots
    asking = root is None and not paired and choice.interactive
    if asking and await paired_devices(database_url) == 0:
        root = _ask_for_root()
    if root is None and not paired:
        return None
    name = choice.name or default_device_name()
    return LocalDeviceRequest(root=root, name=name, announce=say)


def _ask_for_root() -> Path | None:
    """The one question of a first interactive run: may this machine run the work?"""
    say(
        "No device is paired yet. This machine can be one: endpointd will run the agent's\n"
        "commands here, sandboxed, inside one directory you choose (your code's parent,\n"
        "e.g. ~/src). Press Enter to skip (`superagent up --device DIR` later)."
    )
    while True:
        raw = click.prompt("Directory", default="", show_default=False, err=True).strip()
        if not raw:
            return None
        try:
            return allowed_root(raw)
        except click.BadParameter as exc:
            say(f"  {exc.message}")


def allowed_root(raw: str) -> Path:
    path = Path(raw).expanduser()
    if not path.is_dir():
        raise click.BadParameter(f"{raw} is not a directory", param_hint="--device")
    return path.resolve()


async def _next_steps(settings: Settings, database_url: str) -> None:
    """Where to go from a control plane with no device (printed only while there is none)."""
    if await paired_devices(database_url) > 0:
        return
    http = settings.http.local_url()
    say(
        "Next steps:\n"
        "  1. Make a device: `superagent up --device ~/src` runs work on this machine,\n"
        "     inside ~/src; `superagent devices pair --name NAME` pairs another one.\n"
        '  2. Talk to the agent: `superagent say "/run NAME echo hello"`.\n'
        f"  3. Open the console: {http}/console (the sign-in link follows)."
    )


@click.command()
@_state_dir
@_http_port
@_grpc_port
@click.option("--no-migrate", is_flag=True, help="Refuse an old schema instead of upgrading it.")
@click.option(
    "--device",
    "device_root",
    metavar="DIR",
    help="Also make this machine a device that works inside DIR (paired on first use, "
    "then started with `up` every time).",
)
@click.option(
    "--device-name",
    metavar="NAME",
    help="This machine's device name when it is paired (default: its host name).",
)
@click.option("--no-device", is_flag=True, help="Do not start this machine's device.")
@_json
def up(
    state_dir: Path | None,
    http_port: int | None,
    grpc_port: int | None,
    no_migrate: bool,
    device_root: str | None,
    device_name: str | None,
    no_device: bool,
) -> None:
    """Run the whole control plane on this machine.

    \b
    Your first ticket:
      superagent up --device ~/src         this machine becomes a device working in ~/src
      superagent say "/run NAME echo hi"   (another shell) the command runs there

    With --device DIR this machine is also a device: the first time, `up` pairs a local
    endpointd with itself (its files under STATE_DIR/device, its key in the OS keyring or,
    without one, a 0600 file there) and writes DIR into that endpointd's policy as the
    only allowed root; afterwards every `up` starts it, until --no-device. On a terminal,
    a first run without devices asks for DIR instead.

    Without DATABASE_URL an embedded Postgres starts from the state directory. The schema
    is upgraded on start. Serves the console and API over HTTP and the device gateway over
    gRPC until Ctrl-C.

    Every HTTP surface needs the admin token. Without SUPERAGENT_ADMIN_TOKEN, `up`
    generates one into STATE_DIR/admin-token (0600; `superagent say` reads it there) and
    prints a one-time sign-in link. Listening beyond loopback (SUPERAGENT_HTTP__HOST)
    needs a token you set.

    The watchdog runs beside it as a child process, restarted if it dies
    (SUPERAGENT_WATCHDOG__EMBEDDED=false: run `superagent watchdog` yourself).
    """
    if no_device and (device_root or device_name):
        raise click.UsageError("--no-device contradicts --device/--device-name")
    root = allowed_root(device_root) if device_root else None
    settings, generated = _settings(state_dir, http_port, grpc_port)
    device = DeviceChoice(
        root=root, name=device_name, refused=no_device, interactive=sys.stdin.isatty()
    )
    # The link is printed where the token was generated here: whoever configured their
    # own token knows it, and a deployment's logs must not collect sign-in links.
    _run(
        settings,
        apply_migrations=not no_migrate,
        link=generated,
        watchdog=settings.watchdog.embedded,
        device=device,
        # `up` runs in a terminal that is closed sooner or later; a deployment's output
        # (`serve`) belongs to its platform's log collection.
        log_file=True,
    )


@click.command()
@_state_dir
@_http_port
@_grpc_port
@_json
def serve_command(state_dir: Path | None, http_port: int | None, grpc_port: int | None) -> None:
    """Run one replica of a deployment.

    Unlike `up`, it never migrates: it refuses to start on a database whose schema is not
    this release's (run `superagent migrate` once per release, e.g. as a deploy job).
    """
    settings, _ = _settings(state_dir, http_port, grpc_port)
    # A deployment runs `superagent watchdog` once, separately: not one per replica.
    _run(settings, apply_migrations=False, link=False, watchdog=False)
