"""``superagent admission`` (once ``policy``) and ``superagent prompts``: show and edit
immutable versions.

Every edit is saved as a new version on top of the one it was based on; if someone else
saved in between, the edit is refused and kept, so nothing is lost and nothing silently
overwritten. A policy's handles (``github:octocat``, ``@alice``) are resolved to ids before
it is saved (:mod:`controlplane.handles`); one that cannot be is refused the same way.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import sys
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from controlplane import prompts
from controlplane.cli import ops
from controlplane.cli.common import fail, json_option, outcome, setup_logging
from controlplane.deployment import ago
from controlplane.ingest import admission


@dataclass(frozen=True)
class Shown:
    id: str | None
    version: int | None
    author: str | None
    age: str | None
    text: str


def default_author() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def _read_edit(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror or exc}")


def _keep(text: str, suffix: str) -> Path:
    fd, name = tempfile.mkstemp(prefix="superagent-edit-", suffix=suffix)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    return Path(name)


@click.group(name="admission")
def policy() -> None:
    """Show and edit who may ask the agent for what, per source (the admission policy).

    (Once `superagent policy`, a name it still answers to: "policy" is what endpointd calls
    what may run on a device.)

    Each edit is a new, immutable version based on the one you edited. See docs/ingest.md
    for the format.
    """
    setup_logging("WARNING")


@policy.command(name="show")
@click.option("--version", "version_id", help="A version's id (default: the latest).")
@json_option
def policy_show(version_id: str | None, as_json: bool) -> None:
    """Print the policy as JSON (its version goes to stderr; with --json, the version and
    the policy in one document)."""
    shown = _show("policy", admission.POLICY_NAME, version_id)
    _print(shown, "policy", as_json, json.loads(shown.text))


@policy.command(name="edit")
@click.option(
    "--file",
    "path",
    help="Save this file (or - for stdin) instead of opening $EDITOR.",
)
@click.option(
    "--base",
    "base_id",
    help="The version the file was based on (required with --file once a version exists).",
)
@click.option("--author", default=default_author, show_default="user@host")
@json_option
def policy_edit(path: str | None, base_id: str | None, author: str, as_json: bool) -> None:
    """Edit the policy in $EDITOR (or save a file) as a new version."""
    _edit(as_json, "policy", admission.POLICY_NAME, path, base_id, author, ".json")


@click.group(name="prompts")
def prompts_group() -> None:
    """Show and edit the system prompts (router, worker, watchdog).

    Each edit is a new, immutable version based on the one you edited; every model call
    records the version it used.
    """
    setup_logging("WARNING")


_PROMPT_NAME = click.Choice(sorted(prompts.DEFAULTS))


@prompts_group.command(name="show")
@click.argument("name", type=_PROMPT_NAME)
@click.option("--version", "version_id", help="A version's id (default: the latest).")
@json_option
def prompts_show(name: str, version_id: str | None, as_json: bool) -> None:
    """Print a prompt (its version goes to stderr; with --json, the version and the text in
    one document)."""
    shown = _show("prompt", name, version_id)
    _print(shown, f"{name} prompt", as_json, shown.text)


@prompts_group.command(name="edit")
@click.argument("name", type=_PROMPT_NAME)
@click.option("--file", "path", help="Save this file (or - for stdin) instead of $EDITOR.")
@click.option("--base", "base_id", help="The version the file was based on.")
@click.option("--author", default=default_author, show_default="user@host")
@json_option
def prompts_edit(
    name: str, path: str | None, base_id: str | None, author: str, as_json: bool
) -> None:
    """Edit a prompt in $EDITOR (or save a file) as a new version."""
    _edit(as_json, "prompt", name, path, base_id, author, ".md")


def _show(kind: str, name: str, version_id: str | None) -> Shown:
    found = ops.call("versions.show", kind=kind, name=name, version=version_id)
    created = found["created_at"]
    age = ago(datetime.fromisoformat(created)) if created else None
    return Shown(found["id"], found["version"], found["author"], age, found["text"])


def _print(shown: Shown, what: str, as_json: bool, content: Any) -> None:
    if as_json:
        data = {"id": shown.id, "version": shown.version, "author": shown.author}
        click.echo(json.dumps({**data, "default": shown.id is None, "content": content}, indent=2))
        return
    if shown.id is None:
        click.echo(f"# {what}: built-in default (no version saved yet)", err=True)
    else:
        click.echo(
            f"# {what} version {shown.version} ({shown.id}), by {shown.author}, {shown.age}",
            err=True,
        )
    click.echo(shown.text, nl=False)


def _edit(
    as_json: bool,
    kind: str,
    name: str,
    path: str | None,
    base_id: str | None,
    author: str,
    suffix: str,
) -> None:
    """Edit in $EDITOR (or read ``path``), then save on the database or the deployment; a
    refused edit is kept in a file, named, so nothing typed is lost."""
    if path is None:
        if base_id is not None:
            fail("--base goes with --file; in $EDITOR you edit the latest version")
        current = _show(kind, name, None)
        base_id = current.id
        edited = click.edit(current.text, extension=suffix, require_save=True)
        if edited is None or edited == current.text:
            outcome(as_json, {"saved": False}, "No changes; nothing saved.")
            return
        text = edited
    else:
        text = _read_edit(path)
    try:
        saved = ops.call(
            "versions.save", kind=kind, name=name, text=text, base=base_id, author=author
        )
    except SystemExit:
        kept = _keep(text, suffix) if path is None else Path(path)
        click.echo(f"nothing saved; your text is in {kept}", err=True)
        raise
    for note in saved["resolved"]:
        click.echo(f"resolved {note}", err=True)
    based = f"based on {base_id}" if base_id else "the first version"
    outcome(
        as_json,
        {k: saved[k] for k in ("saved", "name", "id", "version", "base")},
        f"saved {name} version {saved['version']} ({saved['id']}), {based}",
    )
