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
