"""The local audit log: every refusal and every approval outcome, on the device only.

``<state dir>/audit.log`` holds one JSON object per line: ``time`` (UTC, ISO 8601),
``event`` (``refused``, ``approval_requested``, ``approved``, ``denied``,
``approval_timeout``, …), ``command_id``, ``rule`` (as the policy file names it) and
``detail``. The file is 0600 and only ever appended to, one ``write`` per line, so lines
from concurrent writers never interleave. It never leaves the device and must never hold a
secret value: callers pass names and messages, and a daemon with credentials loaded passes
its redactor (``redact=``) as a last line of defence.
"""

from __future__ import annotations

import collections
import datetime as dt
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from endpointd.paths import ensure_private_dir

AUDIT_FILE = "audit.log"
# A detail longer than this is cut: the log records decisions, not command output.
MAX_DETAIL_CHARS = 4000


class AuditLog:
    def __init__(self, state_dir: Path, *, redact: Callable[[str], str] | None = None) -> None:
        self.state_dir = state_dir
        self.path = state_dir / AUDIT_FILE
        self._redact = redact

    def record(self, event: str, command_id: str, rule: str, detail: str) -> None:
        """Append one line. Raises OSError if the log cannot be written (callers decide)."""
        if len(detail) > MAX_DETAIL_CHARS:
            detail = detail[:MAX_DETAIL_CHARS] + "…"
        entry = {
            "time": dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
            "event": event,
            "command_id": command_id,
            "rule": rule,
            "detail": detail,
        }
        line = json.dumps(entry, ensure_ascii=False) + "\n"
        if self._redact is not None:
            line = self._redact(line)
        ensure_private_dir(self.state_dir)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(self.path, flags | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            if os.name == "posix" and os.fstat(fd).st_mode & 0o077:
                os.fchmod(fd, 0o600)  # created by something else, or by hand: tighten it
            os.write(fd, line.encode("utf-8"))
        finally:
            os.close(fd)

    def tail(self, count: int | None = None) -> list[dict[str, Any]]:
        """The last ``count`` entries (all when None), oldest first; unparsable lines are
        returned as ``{"event": "unparsable", "detail": <line>}`` rather than hidden."""
        try:
            with open(self.path, encoding="utf-8", errors="replace") as handle:
                lines = collections.deque(handle, maxlen=count) if count else list(handle)
        except FileNotFoundError:
            return []
        out: list[dict[str, Any]] = []
        for line in lines:
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except ValueError:
                entry = None
            out.append(
                entry
                if isinstance(entry, dict)
                else {"event": "unparsable", "detail": line.rstrip("\n")}
            )
        return out
