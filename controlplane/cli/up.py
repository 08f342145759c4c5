"""``superagent up`` (everything on this machine) and ``superagent serve`` (one replica)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from controlplane.cli.common import clear_errors, load_settings, run_until_signalled, setup_logging
from controlplane.db.database import open_database
from controlplane.settings import GrpcSettings, HttpSettings, Settings


def _settings(state_dir: Path | None, http_port: int | None, grpc_port: int | None) -> Settings:
    settings = load_settings(state_dir=state_dir)
    if http_port is not None:
        settings.http = HttpSettings(host=settings.http.host, port=http_port)
    if grpc_port is not None:
        settings.grpc = GrpcSettings(host=settings.grpc.host, port=grpc_port)
    return settings


_state_dir = click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Local state (embedded database, certificates). [env SUPERAGENT_STATE_DIR]",
)
_http_port = click.option("--http-port", type=int, help="HTTP port. [env SUPERAGENT_HTTP__PORT]")
_grpc_port = click.option("--grpc-port", type=int, help="gRPC port. [env SUPERAGENT_GRPC__PORT]")


def _run(settings: Settings, *, apply_migrations: bool) -> None:
    setup_logging(settings.log_level)
    # Imported here: the runtime pulls in uvicorn, grpc and openai, which every other
    # command (`superagent say`, `status`, ...) would otherwise pay for at start.
    from controlplane.runtime import serve

    async def main(stop: asyncio.Event) -> None:
        with clear_errors(), open_database(settings) as database:
            where = "embedded Postgres" if database.embedded else "DATABASE_URL"
            click.echo(
                f"Super-agent on http://{settings.http.host}:{settings.http.port} "
                f"(devices: {settings.grpc.host}:{settings.grpc.port}, database: {where}). "
                + (
                    f"Chat: http://{settings.http.host}:{settings.http.port}/chat. "
                    if settings.webchat.enabled
                    else ""
                )
                + "Ctrl-C stops.",
                err=True,
            )
            await serve(settings, database.url, stop, apply_migrations=apply_migrations)

    run_until_signalled(main)


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
    """
    _run(_settings(state_dir, http_port, grpc_port), apply_migrations=not no_migrate)


@click.command()
@_state_dir
@_http_port
@_grpc_port
def serve_command(state_dir: Path | None, http_port: int | None, grpc_port: int | None) -> None:
    """Run one replica of a deployment.

    Unlike `up`, it never migrates: it refuses to start on a database whose schema is not
    this release's (run `superagent migrate` once per release, e.g. as a deploy job).
    """
    _run(_settings(state_dir, http_port, grpc_port), apply_migrations=False)
