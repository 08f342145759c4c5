"""`endpointd workspaces list|prune`: the tickets' workspaces on this machine."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from typing import Any

import click

from endpointd.cli.root import cli, json_option
from endpointd.paths import config_dir, data_dir, state_dir

# ---------------------------------------------------------------------------- workspaces


@cli.group()
def workspaces() -> None:
    """The tickets' own working trees on this machine: list them, prune them.

    Each ticket the agent works on here gets a git worktree of your clone, on branch
    superagent/<ticket>, under endpointd's data dir (workspaces/<ticket>); your own
    checkout, index, stashes and uncommitted changes are never touched. A ticket's
    commands may write only in its workspace (and, in your clone's .git, what a commit
    on that branch writes). When the ticket ends its workspace is released, and removed
    once [workspaces] retention_hours (default 72) has passed; the oldest released ones
    also go whenever the workspaces take more than max_disk_mb. Removing one keeps its
    branch if anything was committed on it.

    \b
    Examples:
      endpointd workspaces list
      endpointd workspaces prune --dry-run
      endpointd workspaces prune --all-released
    """


def _manager() -> Any:
    from endpointd.workspaces.manager import Workspaces

    return Workspaces(state_dir().path, data_dir().path)


def _size(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    value = size / 1024
    for unit in ("KB", "MB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GB"


def _age(seconds: float) -> str:
    if seconds < 3600:
        return f"{int(seconds // 60)} min"
    if seconds < 86400 * 2:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


@workspaces.command("list")
@json_option()
def workspaces_list(as_json: bool) -> None:
    """Show every ticket workspace: ticket, repository, branch, path, state, size, age.

    The state is active (the ticket works there), released (the ticket ended; it is
    removed once the retention has passed) or creating (being made right now, or left
    half made by a crash: the next prepare starts it over). The size is measured now, as
    du would; a workspace used in place (a directory that is not a git repository) is
    your own directory and never removed, so it shows no size.
    """
    from endpointd.guard.approvals import printable
    from endpointd.workspaces.usage import disk_usage

    now = time.time()
    rows = []
    for record in _manager().list():
        size = 0 if record.in_place else disk_usage(record.path)
        rows.append(
            {
                "ticket": record.ticket,
                "repo": record.repo,
                "branch": record.branch,
                "path": record.answer_path,
                "clone": record.clone,
                "state": record.state,
                "in_place": record.in_place,
                "size_bytes": size,
                "created_at": record.created_at,
                "released_at": record.released_at,
                "age_seconds": round(now - record.created_at),
            }
        )
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo(f"no workspaces (they are made under {data_dir().path / 'workspaces'})")
        return
    for row in rows:
        state = "in place" if row["in_place"] else row["state"]
        if row["released_at"]:
            state += f" {_age(now - row['released_at'])} ago"
        shown = "-" if row["in_place"] else _size(row["size_bytes"])
        click.echo(
            printable(
                f"{row['ticket']}  {row['repo'] or '(no remote)'}  {row['branch'] or '-'}"
                f"  {state}  {shown}  {_age(row['age_seconds'])} old"
            )
        )
        click.echo(printable(f"  {row['path']}"))


@workspaces.command("prune")
@click.option(
    "--all-released",
    is_flag=True,
    help="Remove every released workspace now, whatever the retention says.",
)
@click.option("--dry-run", is_flag=True, help="Only say what would be removed.")
@json_option()
def workspaces_prune(all_released: bool, dry_run: bool, as_json: bool) -> None:
    """Remove released workspaces that are past the retention or over the disk budget.

    The daemon does this on its own every few minutes and whenever a ticket ends; this
    runs it now (safe while the daemon runs). Only released workspaces are ever removed,
    never one a ticket still works in. A workspace's branch goes with it only if nothing
    was committed on it; otherwise the branch stays in your clone (git branch -D it when
    you are done). The rules are [workspaces] retention_hours and max_disk_mb in
    policy.toml (`endpointd policy show`).
    """
    from endpointd.guard import daemon_programs
    from endpointd.guard.approvals import printable
    from endpointd.guard.policy import load_policy

    policy = load_policy(config_dir().path, state_directory=state_dir().path)
    # The git it runs comes from where the daemon's would (never a root commands write).
    daemon_programs.configure_for(policy, config_dir().path, state_dir().path)
    removed = _manager().prune(policy, all_released=all_released, dry_run=dry_run)
    if as_json:
        click.echo(json.dumps([asdict(r) for r in removed], indent=2))
        return
    if not removed:
        click.echo("nothing to prune")
        return
    verb = "would remove" if dry_run else "removed"
    for r in removed:
        if r.error:
            click.echo(printable(f"could not remove {r.ticket} ({r.path}): {r.error}"))
            continue
        kept = " (its branch has commits: kept)" if r.branch_kept else ""
        click.echo(printable(f"{verb} {r.ticket}: {r.path}, {r.reason}{kept}"))
