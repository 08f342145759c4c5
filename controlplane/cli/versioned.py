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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import click

from controlplane import handles, prompts, versions
from controlplane.cli.common import fail, json_option, load_settings, outcome, setup_logging
from controlplane.cli.dbsession import run_with_pool
from controlplane.deployment import ago
from controlplane.errors import InvalidInput
from controlplane.ingest import admission
from controlplane.settings import Settings


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


def _policy_text(body: Any) -> str:
    return json.dumps(body, indent=2, sort_keys=False) + "\n"


def _policy_body(text: str) -> Any:
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"not valid JSON: {exc.msg} at line {exc.lineno}") from None
    # Validated, then stored as written out by the model: defaults filled in, so every
    # version is complete on its own.
    return admission.parse(body).model_dump(mode="json")


def _resolve_policy(settings: Settings, body: Any) -> Any:
    """The policy with its handles replaced by ids, looked up before any transaction."""

    async def work(pool: asyncpg.Pool) -> tuple[Any, list[str]]:
        async with handles.Resolver(settings, pool) as resolver:
            return await resolver.policy(body)

    resolved, notes = run_with_pool(settings, work)
    for note in notes:
        click.echo(f"resolved {note}", err=True)
    return resolved


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
    shown = _show(versions.POLICY, admission.POLICY_NAME, version_id, _policy_default)
    _print(shown, "policy", as_json, json.loads(shown.text))


def _policy_default() -> str:
    return _policy_text(admission.Admission().model_dump(mode="json"))


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
    _edit(
        as_json,
        versions.POLICY,
        admission.POLICY_NAME,
        path=path,
        base_id=base_id,
        author=author,
        default=_policy_default,
        to_body=_policy_body,
        to_text=_policy_text,
        suffix=".json",
        prepare=_resolve_policy,
    )


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
    shown = _show(versions.PROMPT, name, version_id, lambda: prompts.DEFAULTS[name] + "\n")
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

    def to_body(text: str) -> str:
        if not text.strip():
            raise InvalidInput("a prompt cannot be empty")
        return text.rstrip("\n")

    _edit(
        as_json,
        versions.PROMPT,
        name,
        path=path,
        base_id=base_id,
        author=author,
        default=lambda: prompts.DEFAULTS[name] + "\n",
        to_body=to_body,
        to_text=lambda body: str(body) + "\n",
        suffix=".md",
    )


def _text_of(kind: versions.Kind, row: versions.Version) -> str:
    return _policy_text(row.body) if kind is versions.POLICY else row.body + "\n"


def _show(
    kind: versions.Kind,
    name: str,
    version_id: str | None,
    default: Callable[[], str],
) -> Shown:
    async def work(pool: asyncpg.Pool) -> Shown:
        row: versions.Version | None
        if version_id is not None:
            row = await versions.get(pool, kind, version_id)
            if row.name != name:
                raise InvalidInput(f"{version_id} is a version of {row.name}, not of {name}")
        else:
            row = await versions.latest(pool, kind, name)
        if row is None:
            return Shown(None, None, None, None, default())
        return Shown(row.id, row.version, row.author, ago(row.created_at), _text_of(kind, row))

    return run_with_pool(load_settings(), work)


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
    kind: versions.Kind,
    name: str,
    *,
    path: str | None,
    base_id: str | None,
    author: str,
    default: Callable[[], str],
    to_body: Callable[[str], Any],
    to_text: Callable[[Any], str],
    suffix: str,
    prepare: Callable[[Settings, Any], Any] | None = None,
) -> None:
    settings = load_settings()
    if path is None:
        if base_id is not None:
            fail("--base goes with --file; in $EDITOR you edit the latest version")
        current = _show(kind, name, None, default)
        base_id = current.id
        edited = click.edit(current.text, extension=suffix, require_save=True)
        if edited is None or edited == current.text:
            outcome(as_json, {"saved": False}, "No changes; nothing saved.")
            return
        text = edited
    else:
        text = _read_edit(path)
    try:
        body = to_body(text)
    except InvalidInput as exc:
        kept = _keep(text, suffix) if path is None else Path(path)
        fail(f"{exc.message}\nnothing saved; your text is in {kept}")
    if prepare is not None:
        try:
            body = prepare(settings, body)
        except SystemExit:  # the reason is printed already
            kept = _keep(text, suffix) if path is None else Path(path)
            click.echo(f"nothing saved; your text is in {kept}", err=True)
            raise

    async def work(pool: asyncpg.Pool) -> versions.Version:
        return await versions.save(pool, kind, name=name, body=body, base_id=base_id, author=author)

    try:
        saved = run_with_pool(settings, work)
    except SystemExit:
        if path is None:
            kept = _keep(to_text(body), suffix)
            click.echo(f"your edit is kept in {kept}; apply it again with --file", err=True)
        raise
    based = f"based on {base_id}" if base_id else "the first version"
    outcome(
        as_json,
        {"saved": True, "name": name, "id": saved.id, "version": saved.version, "base": base_id},
        f"saved {name} version {saved.version} ({saved.id}), {based}",
    )
