"""``superagent login``, ``logout`` and ``context``: which deployment the commands manage.

The contexts themselves, and which one a command uses, are :mod:`controlplane.cli.contexts`.
A token is never an argument (argv is visible to every user of the machine and kept in
shell histories): it is read from a file, from standard input, or typed at a prompt that
does not echo it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from controlplane.cli import contexts
from controlplane.cli.common import clear_errors, fail
from controlplane.cli.remote import Remote
from controlplane.errors import ConfigError
from superagent_shared import table


def _read_token(token_file: Path | None) -> str:
    if token_file is not None:
        try:
            token = token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            fail(f"cannot read --token-file {token_file}: {exc.strerror or exc}")
    elif not sys.stdin.isatty():
        token = sys.stdin.readline().strip()
    else:
        token = click.prompt("Token", hide_input=True).strip()
    if not token:
        fail("no token given: pass --token-file FILE, pipe it on standard input, or type it")
    return token


@click.command()
@click.argument("url")
@click.option(
    "--name",
    "context_name",
    metavar="CONTEXT",
    help="What to call this deployment. [default: the URL's host]",
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Read the token from this file (else standard input, else a prompt).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def login(url: str, context_name: str | None, token_file: Path | None, as_json: bool) -> None:
    """Manage a deployed control plane from here, over its API.

    URL is the control plane's address (https://HOST[:PORT]).

    Checks the token with the server, then stores URL and token as a context (a file only
    you can read) and makes it the current one: from then on `superagent tickets`,
    `devices` and the other admin commands work on that deployment, as the token's holder.

    The token: a named one, made on the server with `superagent tokens create NAME` (its
    name is who acts, in the records), or the admin token. It is never an argument.

    \b
    Examples:
      superagent login https://agent.example.com --name prod < token.txt
      superagent login https://agent.example.com --token-file ~/.prod-token
      superagent --context prod tickets list
      superagent context use local          # back to this machine's database
    """
    with clear_errors():
        if not url.startswith(("https://", "http://")):
            raise ConfigError(f"{url!r} is not a URL: https://HOST[:PORT]")
        name = contexts.check_name(context_name or (_host(url) or "default"))
        context = contexts.Context(name, url.rstrip("/"), _read_token(token_file))
        who = Remote(context).get("/console/api/whoami")
        contexts.save(context)
    if as_json:
        click.echo(json.dumps({**context.as_json(), "as": who.get("name"), "current": True}))
        return
    click.echo(f"Logged in to {context.url} as {who.get('name')}; context {name!r} is current.")


def _host(url: str) -> str | None:
    host = url.split("://", 1)[-1].split("/", 1)[0].split(":", 1)[0]
    return host if contexts.NAME.fullmatch(host) else None


@click.command()
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def logout(name: str | None, as_json: bool) -> None:
    """Forget a context and its token.

    NAME: the context to forget (default: the current one).

    The token itself still works until it is revoked on the server: `superagent tokens
    revoke NAME` there.
    """
    with clear_errors():
        current, _ = contexts.stored()
        target = name or current
        if target is None:
            raise ConfigError("no current context; name the one to forget (superagent context)")
        contexts.remove(target)
    if as_json:
        click.echo(json.dumps({"removed": target}))
        return
    click.echo(f"Forgot context {target!r}.")


@click.group(invoke_without_command=True)
@click.pass_context
def context(ctx: click.Context) -> None:
    """List the contexts, and choose which deployment to manage.

    `superagent login` adds a context.

    Without a subcommand: the list. A command uses --context NAME, else
    SUPERAGENT_CONTEXT, else the current context, else the database ('local').
    """
    if ctx.invoked_subcommand is None:
        ctx.invoke(list_contexts)


@context.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_contexts(as_json: bool) -> None:
    """The contexts; * marks the current one."""
    with clear_errors():
        current, found = contexts.stored()
    if as_json:
        click.echo(
            json.dumps({"current": current, "contexts": [c.as_json() for c in found]}, indent=2)
        )
        return
    if not found:
        click.echo("No contexts: commands work on the database. superagent login URL adds one.")
        return
    rows = [("*" if c.name == current else "", c.name, c.url) for c in found]
    for line in table.render(("", "CONTEXT", "URL"), rows):
        click.echo(line)
    if current is None:
        click.echo("(none is current: commands work on the database)")


@context.command()
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def use(name: str, as_json: bool) -> None:
    """Make NAME the current context; 'local': none (the database)."""
    with clear_errors():
        contexts.use(name)
    if as_json:
        click.echo(json.dumps({"current": None if name == contexts.LOCAL else name}))
        return
    if name == contexts.LOCAL:
        click.echo("No context is current: commands work on the database.")
    else:
        click.echo(f"Context {name!r} is current.")
