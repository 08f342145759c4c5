"""``<state dir>/status.json``: what the running daemon is doing, for `endpointd status`.

The daemon rewrites it atomically on every state change and heartbeat; readers check that
``pid`` is alive, because a crashed daemon cannot mark itself stopped. ``sandbox`` is the
daemon's one-line description of how it confines commands (``Policy.sandbox_summary``, as
sent in every Hello), refreshed on each connection attempt and heartbeat.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

from endpointd.fsutil import atomic_write

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
