"""`endpointd creds add|list|rm`: credentials in the OS keyring (or, chosen explicitly on a
machine without one, in 0600 files), names and scopes only."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, cast

import click

from endpointd.cli.root import cli, echo_json, json_option
from endpointd.paths import config_dir, state_dir

if TYPE_CHECKING:
    from endpointd.rules.credentials import Store

# ---------------------------------------------------------------------------- credentials


class _Creds(click.Group):
    """``remove`` is the delete verb of both programs; ``rm``, its old name here, still
    answers, neither listed nor taught."""

    ALIASES: ClassVar[dict[str, str]] = {"rm": "remove"}

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return super().get_command(ctx, self.ALIASES.get(cmd_name, cmd_name))


@cli.group(cls=_Creds)
def creds() -> None:
    """Store credentials the agent may use without ever seeing them.

    Values live in your OS keyring (service superagent-endpointd); endpointd hands a value
    to a command only when the command's line matches the credential's scope in the local
    policy ([credentials.NAME] allow = [...] in policy.toml), and masks it, with its common
    encodings, in everything that leaves this machine. The control plane only ever knows
    the names.

    On a machine without a keyring (SSH server, container, WSL), choose the file store:
    --store file, or credential_store = "file" in policy.toml. Values are then 0600 files
    in the 0700 directory credentials/ of the config dir, which commands cannot read: the
    file permissions are the boundary.

    \b
    Examples:
      endpointd creds add github-token          # asks for the value, twice, hidden
      gh auth token | endpointd creds add github-token
      gh auth token | endpointd creds add github-token --store file   # no keyring here
      endpointd creds list
      endpointd creds remove github-token
    """


@creds.command("add")
@click.argument("name")
@click.option("--replace", is_flag=True, help="Overwrite an existing credential of this name.")
@click.option(
    "--store",
    type=click.Choice(["keyring", "file"]),
    help="Where the value goes: the OS keyring, or a 0600 file for machines without one."
    " Default: credential_store in policy.toml, else the keyring. The policy's"
    ' credential_store = "keyring" refuses --store file.',
)
@json_option()
def creds_add(name: str, replace: bool, store: str | None, as_json: bool) -> None:
    """Store a credential; its value is read from a hidden prompt or from stdin.

    In a terminal you are asked for the value twice, without echo; otherwise the value is
    read from stdin (one trailing newline removed). It is never taken from the command
    line, where other local users and shell history could see it. NAME is 1-64 lowercase
    letters, digits, '.', '_' or '-'. Values shorter than 8 characters and structured
    values (JSON, YAML) are refused: store each secret field as its own credential. Then
    allow commands to receive it in policy.toml, e.g. [credentials.github-token] allow =
    ["git *"].

    With no usable keyring, nothing is stored until you choose the file store explicitly
    (--store file or credential_store = "file"): each value is then a 0600 file in the
    0700 directory credentials/ of the config dir, and the file permissions are the
    boundary.
    """
    import getpass

    from endpointd.secrets.store import (
        CredentialError,
        CredentialStore,
        check_name,
        choose_store,
    )

    check_name(name)
    policy_store, policy_file, policy_error = _policy_store()
    if store == "file" and policy_error is not None:
        # A broken policy may pin the keyring: never weaken what cannot be read. The
        # keyring, the stronger store, stays usable.
        raise CredentialError(
            f"--store file needs a readable policy to check it against: {policy_error}"
        )
    chosen = choose_store(cast("Store | None", store), policy_store, policy_file)
    credentials = CredentialStore(config_dir().path)
    credentials.require_store(chosen, name)
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
    credentials.add(name, value, replace=replace, store=chosen)
    if as_json:
        scopes = _scopes()
        # The name, where the value went and who may receive it: never the value.
        echo_json(
            {
                "stored": True,
                "name": name,
                "store": chosen,
                "file": str(credentials.files.path(name)) if chosen == "file" else None,
                "scope": list(scopes[name]) if scopes is not None and name in scopes else None,
            }
        )
        return
    if chosen == "file":
        from endpointd.secrets.file_store import BOUNDARY

        click.echo(f"stored credential {name} in a file, {credentials.files.path(name)}")
        click.echo(f"  {BOUNDARY}")
    else:
        click.echo(f"stored credential {name} in the OS keyring")
    scopes = _scopes()
    if scopes is not None and name not in scopes:
        click.echo(
            f"no command may receive it yet: add [credentials.{name}] with"
            f' allow = ["<command glob>"] to {config_dir().path / "policy.toml"}'
        )


def _policy_store() -> tuple[Store | None, Path, str | None]:
    """The policy's ``credential_store`` (None when unset or there is no policy file), the
    policy file, and why the policy cannot be read when it exists but is broken."""
    from endpointd.guard.policy import load_policy
    from endpointd.rules.terms import POLICY_FILE

    path = config_dir().path / POLICY_FILE
    policy = load_policy(config_dir().path, state_directory=state_dir().path)
    if policy.rules is None:
        return None, path, policy.error if path.exists() else None
    return policy.rules.credential_store, path, None


def _scopes() -> dict[str, tuple[str, ...]] | None:
    """The policy's credential scopes, or None (with a warning) when it is unusable."""
    from endpointd.guard.policy import load_policy

    policy = load_policy(config_dir().path, state_directory=state_dir().path)
    if policy.rules is None:
        click.echo(f"warning: {policy.error}", err=True)
        return None
    return {name: scope.allow for name, scope in policy.rules.credentials.items()}


@creds.command("list")
@json_option()
def creds_list(as_json: bool) -> None:
    """Show stored credentials: names, scopes, store and last use, never values.

    The scope is the list of command globs that may receive the credential, from the
    policy file's [credentials.NAME] table; a credential without one cannot be delivered
    to any command. Names with a scope but no stored value are listed too, as not stored.
    The store is the OS keyring or, on machines without one, a 0600 file (its path is
    shown). This reads only endpointd's own files, never the keyring nor a value.
    """
    from endpointd.secrets.store import CredentialStore

    credentials = CredentialStore(config_dir().path)
    infos = {i.name: i for i in credentials.info()}
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
                "store": info.store if info else None,
                "file": str(credentials.files.path(name))
                if info and info.store == "file"
                else None,
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
            click.echo(f"{row['name']}\n  scope: {scope}\n  NOT STORED (`endpointd creds add` it)")
            continue
        used = f"added {row['added_at']}, last used {row['last_used_at'] or 'never'}"
        where = f"file {row['file']}" if row["store"] == "file" else "OS keyring"
        click.echo(f"{row['name']}\n  scope: {scope}\n  {used}\n  store: {where}")


@creds.command("remove")
@click.argument("name")
@json_option()
def creds_remove(name: str, as_json: bool) -> None:
    """Delete a credential from its store (the OS keyring or its file) and from
    endpointd's list.

    Commands already running keep what they were given; new commands naming it are
    refused. Its [credentials.NAME] scope in policy.toml, if any, stays until you remove
    it, so adding the credential again restores the same access.
    """
    from endpointd.secrets.store import CredentialStore

    CredentialStore(config_dir().path).remove(name)
    if as_json:
        echo_json({"removed": True, "name": name})
        return
    click.echo(f"removed credential {name}")
