"""``superagent tokens``: named API tokens, made and revoked where the database is.

See :mod:`controlplane.access.api_tokens`: a token's name is who acts over the HTTP API.
"""

from __future__ import annotations

import json

import click

from controlplane.access import api_tokens
from controlplane.cli.common import load_settings, setup_logging
from controlplane.cli.dbsession import run_with_pool
from superagent_shared import table


@click.group()
def tokens() -> None:
    """Named API tokens: who acts over the HTTP API.

    Make one per person or script, on the server (where the database is), and hand it
    over: `superagent login URL` on their machine stores it. Everything done with it is
    recorded under its name. Every token may do what the admin token may.

    \b
    Examples:
      superagent tokens create alice > alice.token
      superagent tokens list
      superagent tokens revoke alice
    """
    setup_logging("WARNING")


@tokens.command()
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def create(name: str, as_json: bool) -> None:
    """A new token for NAME, printed once on standard output (it is not stored: only its
    hash is)."""
    secret = run_with_pool(
        load_settings(), lambda pool: api_tokens.create(pool, name, created_by="the CLI")
    )
    if as_json:
        click.echo(json.dumps({"name": name, "token": secret}))
        return
    click.echo(secret)
    click.echo(
        f"The token for {name}: give it to them, once. `superagent login URL` stores it.",
        err=True,
    )


@tokens.command(name="list")
@click.option("--all", "everything", is_flag=True, help="Revoked tokens too.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_tokens(everything: bool, as_json: bool) -> None:
    """The tokens (never their secrets): who, since when, last used."""
    found = run_with_pool(
        load_settings(), lambda pool: api_tokens.listing(pool, everything=everything)
    )
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "name": t.name,
                        "created_by": t.created_by,
                        "created_at": t.created_at.isoformat(),
                        "last_used_at": t.last_used_at.isoformat() if t.last_used_at else None,
                        "revoked_at": t.revoked_at.isoformat() if t.revoked_at else None,
                    }
                    for t in found
                ],
                indent=2,
            )
        )
        return
    if not found:
        click.echo("No tokens. superagent tokens create NAME makes one.")
        return
    rows = [
        (
            t.name,
            f"{t.created_at:%Y-%m-%d %H:%M}",
            f"{t.last_used_at:%Y-%m-%d %H:%M}" if t.last_used_at else "never",
            f"revoked {t.revoked_at:%Y-%m-%d %H:%M}" if t.revoked_at else "live",
        )
        for t in found
    ]
    for line in table.render(("NAME", "CREATED", "LAST USED", "STATE"), rows):
        click.echo(line)


@tokens.command()
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def revoke(name: str, as_json: bool) -> None:
    """Revoke NAME's token: it opens nothing from the next request on."""
    run_with_pool(load_settings(), lambda pool: api_tokens.revoke(pool, name))
    if as_json:
        click.echo(json.dumps({"revoked": name}))
        return
    click.echo(f"Revoked the token of {name}.")
