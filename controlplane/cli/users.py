"""``superagent users``: one person's accounts across channels."""

from __future__ import annotations

import json

import click

from controlplane import people
from controlplane.cli import ops
from controlplane.cli.common import json_option, outcome, setup_logging
from controlplane.errors import InvalidInput


@click.group()
def users() -> None:
    """Link a person's accounts across channels.

    Linked accounts are one initiator: a request on Slack and a comment on GitHub from
    the same person count as the same person's, a policy allowlist may name the person
    instead of each account, and "my laptop" means a device that person owns (a device
    paired with `superagent devices pair NAME --owner PERSON`).

    An account is linked by the channel's immutable id. A handle you give is looked up
    once, now, through the channel's API, and the link keeps the id: a later rename, or
    someone else taking a freed handle, changes nothing.

    \b
    Examples:
      superagent users link alice github:alice-gh slack:alice@acme.example matrix:@alice:example.org
      superagent users list
      superagent users unlink github:alice-gh
      superagent users remove alice
    """


def _accounts(texts: tuple[str, ...]) -> list[people.AccountRef]:
    try:
        return [people.parse_account(text) for text in texts]
    except InvalidInput as exc:
        raise click.BadParameter(exc.message) from None


@users.command()
@click.argument("person")
@click.argument("accounts", nargs=-1, required=True)
@json_option
def link(person: str, accounts: tuple[str, ...], as_json: bool) -> None:
    """Link ACCOUNTS (SOURCE:HANDLE) to PERSON, creating PERSON if new.

    SOURCE is github, slack, matrix, lark or web. HANDLE is the account's immutable id, or
    a handle to look it up by: GitHub, a login or the numeric id; Slack, @handle, an
    email, a user id or TEAM/USER; Lark, an email or the open_id (ou_…); Matrix, the user
    id (@name:server); web, admin (the one web chat identity: whoever holds the admin
    token). Display names are refused. Takes effect within a second.
    """
    setup_logging("WARNING")
    _accounts(accounts)  # a malformed one is a usage error here, before anything is asked
    answer = ops.call("users.link", person=person, accounts=list(accounts))
    outcome(
        as_json,
        {"person": answer["person"], "linked": answer["linked"]},
        f"{answer['person']}: linked {', '.join(answer['shown'])}",
    )


@users.command()
@click.argument("account")
@json_option
def unlink(account: str, as_json: bool) -> None:
    """Unlink one ACCOUNT (SOURCE:ID, or the SOURCE:HANDLE it was linked by)."""
    setup_logging("WARNING")
    _accounts((account,))
    answer = ops.call("users.unlink", account=account)
    outcome(as_json, answer, f"{answer['unlinked']} is no longer linked to {answer['person']}")


@users.command()
@click.argument("person")
@json_option
def remove(person: str, as_json: bool) -> None:
    """Forget PERSON and all their links (their past events keep their accounts)."""
    setup_logging("WARNING")
    answer = ops.call("users.remove", person=person)
    outcome(as_json, answer, f"removed {person}")


@users.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_(as_json: bool) -> None:
    """Show every person and their linked accounts."""
    setup_logging("WARNING")
    everyone = ops.call("users.list")
    if as_json:
        click.echo(json.dumps(everyone, indent=2))
        return
    if not everyone:
        click.echo("nobody linked yet: superagent users link PERSON SOURCE:HANDLE ...")
        return
    for name, accounts in everyone.items():
        click.echo(f"{name}: {', '.join(accounts) or '(no accounts)'}")
