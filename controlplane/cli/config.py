"""``superagent config``: what the control plane will run with, secrets masked."""

from __future__ import annotations

import json

import click

from controlplane.cli.common import load_settings
from controlplane.db.urls import redacted
from controlplane.settings import describe, markdown_table


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--markdown", is_flag=True, help="The reference table of every setting (README).")
def config(as_json: bool, markdown: bool) -> None:
    """Show the effective configuration and where each value comes from."""
    if markdown:
        click.echo(markdown_table(), nl=False)
        return
    settings = load_settings()
    values = settings.model_dump(mode="json")
    # SecretStr dumps as '**********'; the database URL may carry a password inline.
    if settings.database_url:
        values["database_url"] = redacted(settings.database_url)
    if as_json:
        click.echo(json.dumps(values, indent=2))
        return
    for env, _default, description in describe():
        click.echo(f"{env:<36} {description}")
    click.echo()
    click.echo(json.dumps(values, indent=2))
