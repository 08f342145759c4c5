"""``superagent config``: what the control plane will run with, secrets masked, and where
each value comes from."""

from __future__ import annotations

import json
import os
from typing import Any

import click

from controlplane.cli.common import load_settings
from controlplane.db.urls import redacted
from controlplane.settings import leaves, markdown_table, source_of


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (the values).")
@click.option(
    "--markdown", is_flag=True, help="The reference table of every setting (docs/configuration.md)."
)
def config(as_json: bool, markdown: bool) -> None:
    """Show the effective configuration and where each value comes from.

    One line per setting: its variable, its value (secrets masked, a database URL's
    password too) and its source: the variable that set it, the file its `_FILE` named,
    or the default. `--markdown` prints the reference table of every setting instead.
    """
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
    rows = []
    for path, names in leaves():
        value: Any = values
        for part in path:
            value = value.get(part) if isinstance(value, dict) else None
        shown = (
            "unset" if value is None else json.dumps(value) if not isinstance(value, str) else value
        )
        rows.append((names[0], shown, source_of(names, os.environ)))
    width = max(len(name) for name, _, _ in rows)
    for name, shown, source in rows:
        click.echo(f"{name:<{width}}  {shown}  ({source})")
