"""Contexts: the deployments this CLI manages over HTTP, by name, as gh and kubectl do.

``superagent login URL`` stores a context: the control plane's URL and an API token (the
admin token, or better a named one, ``superagent tokens create``, whose name is who acts).
A command then reaches that deployment through its HTTP API, under the token's identity,
instead of opening its database: whoever manages a control plane on a cloud VM needs no
database credentials and no ssh.

Which context a command uses: ``--context NAME``, else ``SUPERAGENT_CONTEXT``, else the
current one (the last ``login`` or ``context use``), else none: the database, as before
(``DATABASE_URL`` or the embedded one). ``local`` names that: no context. Commands that
run the deployment itself (``up``, ``serve``, ``migrate``, ``watchdog``, ``tokens``) and
the ones about this machine (``config``, ``doctor``) always work on the database.

The contexts live in one JSON file, ``$XDG_CONFIG_HOME/superagent/contexts.json`` (else
``~/.config/…``), readable by this user only (0600, in a 0700 directory) because it holds
tokens; it is written whole to a new file and renamed, so a crash never leaves half of it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from controlplane.errors import ConfigError

ENV = "SUPERAGENT_CONTEXT"
LOCAL = "local"  # no context: the database
META = "superagent.context"  # where the root command keeps --context
# The commands that always work on the database: they run the deployment, or are about
# this machine's configuration.
ON_THE_DATABASE = frozenset(
    {"up", "serve", "migrate", "watchdog", "tokens", "config", "doctor", "login", "logout"}
)
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


@dataclass(frozen=True)
class Context:
    name: str
    url: str
    token: str

    def as_json(self) -> dict[str, str]:
        """For people: never the token."""
        return {"name": self.name, "url": self.url}


def path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "superagent" / "contexts.json"


def _load() -> dict[str, Any]:
    file = path()
    try:
        info = file.stat()
    except FileNotFoundError:
        return {"current": None, "contexts": {}}
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"{file} holds tokens and is readable by other users; `chmod 600 {file}`, and "
            "think about revoking its tokens (superagent tokens revoke NAME)"
        )
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{file} cannot be read ({exc}); delete it and log in again") from exc
    if not isinstance(data, dict) or not isinstance(data.get("contexts"), dict):
        raise ConfigError(f"{file} is not a contexts file; delete it and log in again")
    return data


def _save(data: dict[str, Any]) -> None:
    file = path()
    file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    # mkstemp creates the file 0600: the tokens are never readable by others, not even for
    # an instant; the rename replaces the old file whole.
    fd, temporary = tempfile.mkstemp(dir=file.parent, prefix=".contexts-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(data, out, indent=2)
            out.write("\n")
        os.replace(temporary, file)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def check_name(name: str) -> str:
    if not NAME.fullmatch(name):
        raise ConfigError(
            f"{name!r} is not a context name: letters, digits, '.', '_' and '-', at most 63"
        )
    if name == LOCAL:
        raise ConfigError(f"{LOCAL!r} means no context (the database); pick another name")
    return name


def stored() -> tuple[str | None, list[Context]]:
    """The current context's name, and every context, by name."""
    data = _load()
    found = [
        Context(name, str(entry.get("url", "")), str(entry.get("token", "")))
        for name, entry in sorted(data["contexts"].items())
        if isinstance(entry, dict)
    ]
    current = data.get("current")
    return (current if isinstance(current, str) else None), found


def save(context: Context, *, make_current: bool = True) -> None:
    data = _load()
    data["contexts"][context.name] = {"url": context.url, "token": context.token}
    if make_current:
        data["current"] = context.name
    _save(data)


def use(name: str) -> None:
    """``name`` becomes the current context; ``local``: none."""
    data = _load()
    if name != LOCAL and name not in data["contexts"]:
        raise ConfigError(_unknown(name, data))
    data["current"] = None if name == LOCAL else name
    _save(data)


def remove(name: str) -> None:
    data = _load()
    if name not in data["contexts"]:
        raise ConfigError(_unknown(name, data))
    del data["contexts"][name]
    if data.get("current") == name:
        data["current"] = None
    _save(data)


def _unknown(name: str, data: dict[str, Any]) -> str:
    known = ", ".join(sorted(data["contexts"])) or "none yet: superagent login URL"
    return f"no context named {name!r} (contexts: {known})"


def chosen() -> Context | None:
    """The context this command works through, or None: the database."""
    ctx = click.get_current_context(silent=True)
    if ctx is not None and _command_path(ctx)[:1] and _command_path(ctx)[0] in ON_THE_DATABASE:
        return None
    explicit = (ctx.find_root().meta.get(META) if ctx is not None else None) or os.environ.get(ENV)
    current, found = stored()
    name = explicit or current
    if name is None or name == LOCAL:
        return None
    for context in found:
        if context.name == name:
            return context
    where = "--context" if explicit and ctx and ctx.find_root().meta.get(META) else ENV
    if not explicit:
        where = f"the current context ({path()})"
    raise ConfigError(
        f"{where} names {name!r}, which is not a context "
        f"(contexts: {', '.join(c.name for c in found) or 'none yet: superagent login URL'})"
    )


def _command_path(ctx: click.Context) -> list[str]:
    """The subcommands' names from the root down (``["tickets", "list"]``)."""
    names = []
    while ctx.parent is not None:
        if ctx.info_name:
            names.append(ctx.info_name)
        ctx = ctx.parent
    return list(reversed(names))


def command_line() -> str:
    ctx = click.get_current_context(silent=True)
    return " ".join(["superagent", *(_command_path(ctx) if ctx else [])])
