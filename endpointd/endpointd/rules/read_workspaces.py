"""The policy's ``[workspaces]`` table: which repositories get a ticket workspace, how long
a released one is kept, the disk all of them may take, and each repository's setup."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from endpointd.rules.reader import Reader
from endpointd.rules.tables import WorkspaceRules

_WORKSPACE_KEYS = (
    "allow",
    "ask",
    "deny",
    "retention_hours",
    "max_disk_mb",
    "setup",
    "repository_setup",
)
# A repository as the device reports it: host/owner/name (more segments for nested groups).
_REPOSITORY = re.compile(r"[a-z0-9._~\[\]:-]+(/[A-Za-z0-9._~-]+){2,}\Z")


def workspace_rules(reader: Reader, data: Mapping[str, Any]) -> WorkspaceRules:
    raw = reader.table(data, "workspaces", _WORKSPACE_KEYS)
    globs = {
        key: _repository_globs(reader, raw, key)
        for key in ("allow", "ask", "deny", "repository_setup")
    }
    retention = raw.get("retention_hours", WorkspaceRules.retention_hours)
    if type(retention) is not int or retention < 0:
        raise reader.fail(
            "workspaces.retention_hours must be a whole number of hours, 0 or more (0:"
            f" remove a released workspace at once), got {retention!r}",
            "workspaces",
            "retention_hours",
        )
    budget = raw.get("max_disk_mb", WorkspaceRules.max_disk_mb)
    if type(budget) is not int or budget <= 0:
        raise reader.fail(
            f"workspaces.max_disk_mb must be a positive integer, got {budget!r}",
            "workspaces",
            "max_disk_mb",
        )
    return WorkspaceRules(
        allow=globs["allow"],
        ask=globs["ask"],
        deny=globs["deny"],
        retention_hours=retention,
        max_disk_mb=budget,
        setup=_setup_commands(reader, raw),
        repository_setup=globs["repository_setup"],
    )


def _repository_globs(reader: Reader, raw: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = raw.get(key, [])
    if not isinstance(value, list) or not all(
        isinstance(g, str) and g.strip() and not any(c.isspace() for c in g) for g in value
    ):
        raise reader.fail(
            f'workspaces.{key} must be a list of repository globs, e.g. ["github.com/acme/*"]',
            "workspaces",
            key,
        )
    return tuple(g.lower() for g in value)


def _setup_commands(reader: Reader, raw: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """``[workspaces.setup]``: the argv each repository (normalised) is set up with."""
    setup_raw = raw.get("setup", {})
    if not isinstance(setup_raw, dict):
        raise reader.fail(
            "workspaces.setup must be a [workspaces.setup] table of repository ="
            ' command, e.g. "github.com/acme/app" = ["make", "bootstrap"]',
            "workspaces",
            "setup",
        )
    setup: dict[str, tuple[str, ...]] = {}
    for repo, command in setup_raw.items():
        if not _REPOSITORY.match(repo.lower()):
            raise reader.fail(
                f"[workspaces.setup]: {repo!r} is not a repository as devices report it"
                ' (host/owner/name, e.g. "github.com/acme/app")',
                "workspaces.setup",
                None,
            )
        setup[repo.lower()] = _setup_argv(reader, repo, command)
    return setup


def _setup_argv(reader: Reader, repo: str, command: object) -> tuple[str, ...]:
    """A command line (run by sh) or a list of arguments."""
    if isinstance(command, str) and command.strip():
        return ("sh", "-c", command)
    if (
        isinstance(command, list)
        and command
        and all(isinstance(a, str) for a in command)
        and command[0]
    ):
        return tuple(command)
    raise reader.fail(
        f"[workspaces.setup] {json.dumps(repo)} must be a command line (run by"
        ' sh) or a list of arguments, e.g. ["make", "bootstrap"]',
        "workspaces.setup",
        repo,
    )
