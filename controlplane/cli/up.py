"""``superagent up`` (everything on this machine) and ``superagent serve`` (one replica)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import click

from controlplane.access import admin_token
from controlplane.cli.common import (
    clear_errors,
    load_settings,
    run_until_signalled,
    say,
    setup_logging,
)
from controlplane.db.database import open_database
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
        # Before anything starts: a server beyond loopback without a token never listens.
        return admin_token.for_server(settings), settings.admin_token is None


_state_dir = click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Local state (embedded database, certificates). [env SUPERAGENT_STATE_DIR]",
)
_http_port = click.option("--http-port", type=int, help="HTTP port. [env SUPERAGENT_HTTP__PORT]")
_grpc_port = click.option("--grpc-port", type=int, help="gRPC port. [env SUPERAGENT_GRPC__PORT]")


def _announce_link(settings: Settings) -> Callable[[str], None]:
    where = admin_token.token_path(settings)

    def announce(url: str) -> None:
        say(
            f"Sign in to the console: {url}\n"
            f"  (a one-time link, valid for an hour; the admin token is in {where})"
        )

    return announce


def _run(settings: Settings, *, apply_migrations: bool, link: bool, watchdog: bool) -> None:
    setup_logging(settings.log_level)
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
            announce = _announce_link(settings) if link else None
            await serve(
                settings,
                database.url,
                stop,
                apply_migrations=apply_migrations,
                announce=announce,
                watchdog_child=watchdog,
            )

    run_until_signalled(main, shutdown_timeout=settings.shutdown_timeout)


@click.command()
@_state_dir
@_http_port
@_grpc_port
@click.option("--no-migrate", is_flag=True, help="Refuse an old schema instead of upgrading it.")
def up(
    state_dir: Path | None, http_port: int | None, grpc_port: int | None, no_migrate: bool
) -> None:
    """Run the whole control plane on this machine.

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
    settings, generated = _settings(state_dir, http_port, grpc_port)
    # The link is printed where the token was generated here: whoever configured their
    # own token knows it, and a deployment's logs must not collect sign-in links.
    _run(
        settings,
        apply_migrations=not no_migrate,
        link=generated,
        watchdog=settings.watchdog.embedded,
    )


@click.command()
@_state_dir
@_http_port
@_grpc_port
def serve_command(state_dir: Path | None, http_port: int | None, grpc_port: int | None) -> None:
    """Run one replica of a deployment.

    Unlike `up`, it never migrates: it refuses to start on a database whose schema is not
    this release's (run `superagent migrate` once per release, e.g. as a deploy job).
    """
    settings, _ = _settings(state_dir, http_port, grpc_port)
    # A deployment runs `superagent watchdog` once, separately: not one per replica.
    _run(settings, apply_migrations=False, link=False, watchdog=False)
