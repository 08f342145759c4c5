"""What `endpointd status` shows, gathered from local files only, and the file the running
daemon keeps for it.

Three sources, each optional: the pairing (``config.json``), the daemon's live status
(``<state dir>/status.json``, trusted only if its pid is alive) and the command journal
(opened read-only, which WAL mode allows while the daemon writes).

The daemon rewrites ``status.json`` atomically on every state change and heartbeat
(:class:`StatusReporter`); readers check that ``pid`` is alive, because a crashed daemon
cannot mark itself stopped. ``sandbox`` is the daemon's one-line description of how it
confines commands (``Policy.sandbox_summary``, as sent in every Hello), refreshed on each
connection attempt and heartbeat.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import click

from endpointd.config import load_config
from endpointd.errors import ConfigError
from endpointd.fsutil import atomic_write
from endpointd.journal import JOURNAL_FILE, Journal
from endpointd.process.executor import pid_alive

STATUS_FILE = "status.json"


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


class StatusReporter:
    def __init__(self, state_directory: Path, **initial: Any) -> None:
        self.path = state_directory / STATUS_FILE
        self.data: dict[str, Any] = {"pid": os.getpid(), "started_at": now_iso(), **initial}

    def update(self, **fields: Any) -> None:
        if "state" in fields and fields["state"] != self.data.get("state"):
            fields.setdefault("since", now_iso())
        self.data.update(fields)
        self.data["updated_at"] = now_iso()
        # No fsync: this file is a live view, worthless after a power cut anyway.
        atomic_write(self.path, json.dumps(self.data, indent=2).encode(), mode=0o600, fsync=False)


def read_status(state_directory: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((state_directory / STATUS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def sandbox_status(
    config_directory: Path, state_directory: Path, *, running: bool
) -> tuple[str, str]:
    """How commands are confined, and who says so: ``(line, "daemon" | "policy file")``.

    The running daemon's own account when it published one (it probed the sandbox in its
    own process, which is what counts); otherwise what the policy file and this machine
    give, as a daemon started now would see it.
    """
    live = read_status(state_directory) if running else None
    line = live.get("sandbox") if live else None
    if isinstance(line, str) and line:
        return line, "daemon"
    from endpointd.guard.policy import load_policy

    policy = load_policy(config_directory, state_directory=state_directory)
    return policy.sandbox_summary, "policy file"


def sandbox_check_status(
    config_directory: Path, state_directory: Path
) -> tuple[str, dict[str, Any]]:
    """The last `endpointd sandbox check` (:mod:`endpointd.checkresult`), judged against
    the policy in effect now."""
    from endpointd.checkresult import describe
    from endpointd.guard.policy import load_policy

    policy = load_policy(config_directory, state_directory=state_directory)
    return describe(state_directory, policy.hash().hex())


def credential_status(config_directory: Path, state_directory: Path) -> dict[str, Any]:
    """Which store holds this device's credentials, and what guards each, for `status`.

    Counts come from the index (``credentials.json``); no value and no keyring is touched,
    so this answers instantly on a machine without one. ``default_store`` is where
    `endpointd creds add` puts a new value without ``--store`` (the policy's
    ``credential_store``, else the keyring). ``boundary`` names what keeps the values from
    other local users, honestly: for the file store, the file permissions alone.
    """
    from endpointd.guard.policy import load_policy
    from endpointd.secrets.file_store import BOUNDARY
    from endpointd.secrets.store import CredentialError, CredentialStore

    store = CredentialStore(config_directory)
    report: dict[str, Any] = {"keyring": 0, "file": 0, "directory": str(store.files.directory)}
    try:
        for info in store.info():
            report[info.store] += 1
    except CredentialError as exc:
        report["error"] = str(exc)
    rules = load_policy(config_directory, state_directory=state_directory).rules
    report["default_store"] = (rules.credential_store if rules else None) or "keyring"
    uses_files = report["file"] > 0 or report["default_store"] == "file"
    report["boundary"] = BOUNDARY if uses_files else "the OS keyring"
    return report


def credential_line(report: dict[str, Any]) -> str:
    """`credentials: …`, one line, from :func:`credential_status`."""
    if "error" in report:
        return f"credentials: ? ({report['error']})"
    parts = []
    if report["keyring"]:
        parts.append(f"{report['keyring']} in the OS keyring")
    if report["file"]:
        parts.append(f"{report['file']} in files in {report['directory']}")
    held = ", ".join(parts) or "none stored"
    if report["default_store"] == "file":
        held += f" (new ones go to files in {report['directory']})"
    if report["file"] or report["default_store"] == "file":
        return f"credentials: {held}; {report['boundary']}"
    return f"credentials: {held}"


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


# Where `superagent up --device` keeps the endpointd it runs (its state directory's
# "device" folder, at superagent's default state directory).
UP_DEVICE_HOME = Path("~/.local/share/superagent/device")


def up_device() -> str | None:
    """The home of a `superagent up --device` daemon paired on this machine, if any: the
    place to look when this endpointd is not paired but "the device" is connected."""
    home = UP_DEVICE_HOME.expanduser()
    return str(home) if (home / "config" / "config.json").is_file() else None


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
        report["up_device"] = up_device()
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
        home = report.get("up_device")
        if home:
            click.echo(
                "           `superagent up --device` runs an endpointd of its own on this "
                "machine; its status:\n"
                f"           ENDPOINTD_CONFIG_DIR={home}/config ENDPOINTD_STATE_DIR={home}/state "
                "endpointd status"
            )
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
