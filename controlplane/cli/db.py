"""``superagent migrate``: bring the database schema to this release."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import asyncpg
import click

from controlplane.cli.common import clear_errors, fail, load_settings, setup_logging
from controlplane.db import migrate as migrations
from controlplane.db.database import open_database
from controlplane.db.urls import asyncpg_dsn


@click.command()
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="State directory of the embedded database. [env SUPERAGENT_STATE_DIR]",
)
@click.option("--check", is_flag=True, help="Only report; exit 1 if the schema is not current.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def migrate(state_dir: Path | None, check: bool, as_json: bool) -> None:
    """Upgrade the database schema to this release (safe to run from several places at once)."""
    settings = load_settings(state_dir=state_dir)
    setup_logging("WARNING")

    async def run(url: str) -> tuple[str | None, str | None]:
        if not check:
            return await migrations.upgrade(url)
        conn = await asyncpg.connect(asyncpg_dsn(url))
        try:
            return await migrations.current_revision(conn), None
        finally:
            await conn.close()

    with clear_errors(), open_database(settings) as database:
        before, after = asyncio.run(run(database.url))
    head = migrations.head_revision()
    if as_json:
        click.echo(json.dumps({"before": before, "after": after, "head": head}))
    if check:
        if before != head:
            fail(
                f"schema is at {before or 'nothing'}, this release needs {head}; "
                "run `superagent migrate`"
            )
        if not as_json:
            click.echo(f"schema is current ({head})")
        return
    if not as_json:
        if before == after:
            click.echo(f"schema already current ({after})")
        else:
            click.echo(f"schema upgraded: {before or 'empty'} → {after}")
