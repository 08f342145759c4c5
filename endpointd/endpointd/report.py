"""What `endpointd status` shows, gathered from local files only.

Three sources, each optional: the pairing (``config.json``), the daemon's live status
(``status.json``, trusted only if its pid is alive) and the command journal (opened
read-only, which WAL mode allows while the daemon writes).
"""

from __future__ import annotations

import datetime as dt
import sqlite3
from pathlib import Path
from typing import Any

import click

from endpointd.config import load_config
from endpointd.errors import ConfigError
from endpointd.journal import JOURNAL_FILE, Journal
from endpointd.process.executor import pid_alive
from endpointd.status import read_status


def daemon_alive(state_directory: Path) -> int | None:
    """The pid of the daemon using ``state_directory``, if one is running."""
    status = read_status(state_directory)
    if not status or status.get("state") == "stopped":
        return None
    pid = status.get("pid")
    return pid if isinstance(pid, int) and pid_alive(pid) else None


def _commands(state_directory: Path) -> list[dict[str, Any]]:
    path = state_directory / JOURNAL_FILE
    if not path.exists():
        return []
    from endpointd import wire
    from superagent_shared.messages import (
        Cancel,
        Exec,
        Glob,
        ListDir,
        PrepareWorkspace,
        ReadFile,
        ReleaseWorkspace,
        Search,
        WriteFile,
    )

    try:
        journal = Journal(path, readonly=True)
    except sqlite3.Error:
        return []
    try:
        try:
            entries = journal.active()
        except sqlite3.Error:
            # A daemon starting right now may not have created the table yet, and a status
            # report must never fail for that.
            return []
        out = []
        for entry in entries:
            kind = summary = None
            if entry.body is not None:
                command = wire.decode_command(entry.body)
                kind, op = command.kind, command.op
                if isinstance(op, Exec):
                    summary = " ".join(op.argv)
                elif isinstance(op, ReadFile | WriteFile | ListDir):
                    summary = op.path
                elif isinstance(op, Search | Glob):
                    summary = f"{op.pattern!r} in {op.path}"
                elif isinstance(op, Cancel):
                    summary = op.target_command_id
                elif isinstance(op, PrepareWorkspace):
                    summary = f"{op.ticket_id} {op.repo or op.path}"
                elif isinstance(op, ReleaseWorkspace):
                    summary = op.ticket_id
            out.append(
                {
                    "command_id": entry.command_id,
                    "seq": entry.seq,
                    "kind": kind,
                    "state": entry.state,
                    "summary": summary,
                    "received_at": dt.datetime.fromtimestamp(entry.received_at, dt.UTC).isoformat(
                        timespec="seconds"
                    ),
                }
            )
        return out
    finally:
        journal.close()


def collect_status(config_directory: Path, state_directory: Path) -> dict[str, Any]:
    report: dict[str, Any] = {
        "config_dir": str(config_directory),
        "state_dir": str(state_directory),
    }
    try:
        config = load_config(config_directory)
    except ConfigError as exc:
        report["paired"] = False
        report["pairing_error"] = str(exc)
    else:
        report["paired"] = True
        report["server_url"] = config.server_url
        report["server_name"] = config.server_name
        report["device_id"] = config.device_id
        report["device_name"] = config.device_name
        report["trust"] = config.trust.mode
        report["server_cert_sha256"] = config.trust.leaf_sha256
        report["key_storage"] = config.key.storage
        report["paired_at"] = config.paired_at
    live = read_status(state_directory)
    alive = daemon_alive(state_directory)
    daemon: dict[str, Any] = {"running": alive is not None, "pid": alive}
    if live:
        daemon.update(
            {
                "state": live.get("state") if alive is not None else "not running",
                "last_state": live.get("state"),
                "since": live.get("since"),
                "connected_at": live.get("connected_at"),
                "last_heartbeat_at": live.get("last_heartbeat_at"),
                "last_error": live.get("last_error"),
                "last_error_code": live.get("last_error_code"),
                "last_error_at": live.get("last_error_at"),
            }
        )
    else:
        daemon["state"] = "not running"
    report["daemon"] = daemon
    report["commands"] = _commands(state_directory)
    return report


def print_status(report: dict[str, Any]) -> None:
    if report["paired"]:
        click.echo(
            f"paired:    {report['device_id']} ({report['device_name']}) with"
            f" {report['server_name'] or '?'} at {report['server_url']}"
        )
        click.echo(f"trust:     {report['trust']}; key in {report['key_storage']}")
    else:
        click.echo(f"paired:    no ({report['pairing_error']})")
    daemon = report["daemon"]
    if daemon["running"]:
        line = f"daemon:    {daemon['state']} (pid {daemon['pid']}, since {daemon.get('since')})"
    else:
        last = daemon.get("last_state")
        line = "daemon:    not running" + (f" (last state: {last})" if last else "")
    click.echo(line)
    if daemon.get("last_error"):
        click.echo(f"last error: {daemon['last_error']} (at {daemon.get('last_error_at')})")
    commands = report["commands"]
    if not commands:
        click.echo("commands:  none in flight")
        return
    click.echo(f"commands:  {len(commands)} in flight")
    for c in commands:
        summary = (c["summary"] or "")[:60]
        click.echo(f"  {c['command_id']:<20} {c['state']:<9} {c['kind'] or '?':<10} {summary}")
