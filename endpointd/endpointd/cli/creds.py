"""`endpointd creds add|list|rm`: credentials in the OS keyring, names and scopes only."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from endpointd.cli.root import cli
from endpointd.paths import config_dir, state_dir

# ---------------------------------------------------------------------------- credentials


@cli.group()
def creds() -> None:
    """Store credentials the agent may use without ever seeing them.

    Values live in your OS keyring (service superagent-endpointd); endpointd hands a value
    to a command only when the command's line matches the credential's scope in the local
    policy ([credentials.NAME] allow = [...] in policy.toml), and masks it, with its common
    encodings, in everything that leaves this machine. The control plane only ever knows
    the names.

    \b
    Examples:
      endpointd creds add github-token          # asks for the value, twice, hidden
      gh auth token | endpointd creds add github-token
      endpointd creds list
      endpointd creds rm github-token
    """


@creds.command("add")
@click.argument("name")
@click.option("--replace", is_flag=True, help="Overwrite an existing credential of this name.")
def creds_add(name: str, replace: bool) -> None:
    """Store a credential; its value is read from a hidden prompt or from stdin.

    In a terminal you are asked for the value twice, without echo; otherwise the value is
    read from stdin (one trailing newline removed). It is never taken from the command
    line, where other local users and shell history could see it. NAME is 1-64 lowercase
    letters, digits, '.', '_' or '-'. Values shorter than 8 characters and structured
    values (JSON, YAML) are refused: store each secret field as its own credential. Then
    allow commands to receive it in policy.toml, e.g. [credentials.github-token] allow =
    ["git *", "gh *"].
    """
    import getpass

    from endpointd.secrets.store import CredentialError, CredentialStore, check_name

    check_name(name)
    store = CredentialStore(config_dir().path)
    store.require_keyring()
    if sys.stdin.isatty():
        try:
            first = getpass.getpass(f"Value for {name} (hidden): ", stream=sys.stderr)
            second = getpass.getpass("Again, to confirm: ", stream=sys.stderr)
        except EOFError:
            raise CredentialError("no value entered; nothing stored") from None
        if first != second:
            raise CredentialError("the two values differ; nothing stored")
        value = first.encode("utf-8")
    else:
        value = sys.stdin.buffer.read()
        if value.endswith(b"\r\n"):
            value = value[:-2]
        elif value.endswith(b"\n"):
            value = value[:-1]
        if not value:
            raise CredentialError(
                "no value on stdin: pipe it in (e.g. `gh auth token | endpointd creds add"
                f" {name}`) or run this in a terminal to be asked; values are never taken"
                " from the command line"
            )
    store.add(name, value, replace=replace)
    click.echo(f"stored credential {name} in the OS keyring")
    scopes = _scopes()
    if scopes is not None and name not in scopes:
        click.echo(
            f"no command may receive it yet: add [credentials.{name}] with"
            f' allow = ["<command glob>"] to {config_dir().path / "policy.toml"}'
        )


def _scopes() -> dict[str, tuple[str, ...]] | None:
    """The policy's credential scopes, or None (with a warning) when it is unusable."""
    from endpointd.guard.policy import load_policy

    policy = load_policy(config_dir().path, state_directory=state_dir().path)
    if policy.rules is None:
        click.echo(f"warning: {policy.error}", err=True)
        return None
    return {name: scope.allow for name, scope in policy.rules.credentials.items()}


@creds.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def creds_list(as_json: bool) -> None:
    """Show stored credentials: names, scopes and last use, never values.

    The scope is the list of command globs that may receive the credential, from the
    policy file's [credentials.NAME] table; a credential without one cannot be delivered
    to any command. Names with a scope but no stored value are listed too, as not stored.
    This reads only endpointd's own files, never the keyring.
    """
    from endpointd.secrets.store import CredentialStore

    infos = {i.name: i for i in CredentialStore(config_dir().path).info()}
    scopes = _scopes()
    names = sorted(set(infos) | set(scopes or {}))
    rows: list[dict[str, Any]] = []
    for name in names:
        info = infos.get(name)
        rows.append(
            {
                "name": name,
                "stored": info is not None,
                "scope": list(scopes[name]) if scopes is not None and name in scopes else None,
                "added_at": info.added_at if info else None,
                "last_used_at": info.last_used_at if info else None,
            }
        )
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no credentials stored; add one with `endpointd creds add NAME`")
        return
    for row in rows:
        if scopes is None:
            scope = "? (the policy file is unusable)"
        elif row["scope"] is None:
            scope = "none: not delivered to any command"
        else:
            scope = ", ".join(row["scope"]) or "none (empty allow list)"
        if not row["stored"]:
            used = "NOT STORED (`endpointd creds add` it)"
        else:
            used = f"added {row['added_at']}, last used {row['last_used_at'] or 'never'}"
        click.echo(f"{row['name']}\n  scope: {scope}\n  {used}")


@creds.command("rm")
@click.argument("name")
def creds_rm(name: str) -> None:
    """Delete a credential from the OS keyring and from endpointd's list.

    Commands already running keep what they were given; new commands naming it are
    refused. Its [credentials.NAME] scope in policy.toml, if any, stays until you remove
    it, so adding the credential again restores the same access.
    """
    from endpointd.secrets.store import CredentialStore

    CredentialStore(config_dir().path).remove(name)
    click.echo(f"removed credential {name}")
