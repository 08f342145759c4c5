"""Local approvals: commands an ``ask`` rule holds until the user on this machine answers.

This module owns the queue, ``<state dir>/approvals/``: one JSON file per request (named
by a hash of the command id, since ids come from the server and must not pick file names),
written by the daemon (:meth:`Approvals.request`, :meth:`Approvals.forget`) and answered by
the CLI (:meth:`Approvals.decide`, from `endpointd approve ID` / `endpointd deny ID`). The
daemon polls :meth:`Approvals.decision` (or awaits :meth:`Approvals.wait`) and enforces
the timeout itself; an unanswered request is denied.

Requests hold a summary of the command (argv, path, credential *names*), never a secret
value. Anything shown to the user (terminal, desktop notification) is passed through
:func:`printable`, because the text comes from the control plane and must not be able to
drive the terminal (escape sequences) or hide part of itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from endpointd.errors import EndpointdError
from endpointd.fsutil import atomic_write, exclusive_lock
from endpointd.paths import ensure_private_dir
from superagent_proto.v1 import endpoint_pb2

APPROVALS_DIR = "approvals"
# Disables desktop notifications (tests, headless boxes where notify-send would fail noisily).
NO_NOTIFY_ENV = "ENDPOINTD_NO_NOTIFY"
# Requests left behind (e.g. the daemon died while one waited) are deleted this long after
# their deadline.
STALE_AFTER_SECONDS = 3600.0
NOTIFY_TIMEOUT_SECONDS = 30.0

Outcome = Literal["approved", "denied"]


class ApprovalError(EndpointdError):
    """An approval cannot be given or refused (unknown id, already decided, timed out)."""


@dataclass(frozen=True)
class ApprovalRequest:
    command_id: str
    summary: str  # what would run: argv, cwd, credential names; no secret values
    origin: str  # who asked, as the control plane says (carries no authority)
    rule: str  # the policy rule that asks
    requested_at: float  # unix time
    expires_at: float  # unix time; the daemon denies it then
    decision: Outcome | None = None
    decided_at: float | None = None

    @property
    def age_seconds(self) -> float:
        return max(0.0, time.time() - self.requested_at)

    @property
    def seconds_left(self) -> float:
        return max(0.0, self.expires_at - time.time())


def printable(text: str, limit: int = 500) -> str:
    """``text`` safe to show on a terminal or in a notification: control characters (ANSI
    escapes, carriage returns, newlines) escaped, and cut to ``limit`` characters."""
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch.isprintable() or ch == " ":
            out.append(ch)
        else:
            out.append(ch.encode("unicode_escape").decode("ascii"))
    shown = "".join(out)
    return shown if len(shown) <= limit else shown[:limit] + "…"


def summarize(command: endpoint_pb2.Command) -> str:
    """One line describing ``command`` for an approval request (names, never values)."""
    kind = command.WhichOneof("kind")
    if kind == "exec":
        ex = command.exec
        parts = [shlex.join(ex.argv)]
        if ex.cwd:
            parts.append(f"in {ex.cwd}")
        if command.credentials:
            parts.append("with credentials " + ", ".join(c.name for c in command.credentials))
        return " ".join(parts)
    if kind in ("read_file", "write_file", "list_dir"):
        return f"{kind} {getattr(command, kind).path}"
    return kind or "unknown command"


def _file_name(command_id: str) -> str:
    return hashlib.sha256(command_id.encode("utf-8", "surrogatepass")).hexdigest()[:32] + ".json"


class Approvals:
    """The approvals queue under ``<state_dir>/approvals/``."""

    def __init__(self, state_dir: Path) -> None:
        self.directory = state_dir / APPROVALS_DIR

    # ------------------------------------------------------------------ files

    def _path(self, command_id: str) -> Path:
        return self.directory / _file_name(command_id)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        ensure_private_dir(self.directory)
        with exclusive_lock(self.directory / ".lock"):
            yield

    def _load(self, path: Path) -> ApprovalRequest | None:
        try:
            raw: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
            return ApprovalRequest(**raw)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError):
            return None  # torn or foreign file: treated as absent, pruned when stale

    def _save(self, request: ApprovalRequest) -> None:
        data = json.dumps(asdict(request), indent=2) + "\n"
        atomic_write(self._path(request.command_id), data.encode("utf-8"), mode=0o600)

    def _all(self) -> list[tuple[Path, ApprovalRequest | None]]:
        try:
            names = sorted(p for p in self.directory.glob("*.json"))
        except OSError:
            return []
        return [(p, self._load(p)) for p in names]

    # ------------------------------------------------------------------ daemon side

    def request(
        self, command_id: str, summary: str, origin: str, rule: str, timeout_seconds: float
    ) -> None:
        """Queue ``command_id`` for a local decision and notify the desktop, if possible.

        Idempotent: requesting again (e.g. after a daemon restart) keeps the original
        request, its deadline and any decision already made.
        """
        now = time.time()
        with self._locked():
            self._prune(now)
            if self._load(self._path(command_id)) is not None:
                return
            request = ApprovalRequest(
                command_id=command_id,
                summary=summary,
                origin=origin,
                rule=rule,
                requested_at=now,
                expires_at=now + timeout_seconds,
            )
            self._save(request)
        notify(request)

    def decision(self, command_id: str) -> Outcome | None:
        """ "approved" or "denied" once the user answered; None while nobody has."""
        request = self._load(self._path(command_id))
        return None if request is None else request.decision

    async def wait(
        self, command_id: str, timeout_seconds: float, interval: float = 0.2
    ) -> Outcome | Literal["timeout"]:
        """Poll for the user's answer until ``timeout_seconds`` pass; a convenience for the
        daemon, which still has to :meth:`forget` the request afterwards."""
        deadline = time.monotonic() + timeout_seconds
        while True:
            outcome = await asyncio.to_thread(self.decision, command_id)
            if outcome is not None:
                return outcome
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            await asyncio.sleep(min(interval, remaining))

    def forget(self, command_id: str) -> None:
        """Drop the request (after acting on its decision or its timeout)."""
        with self._locked(), contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(command_id))

    def _prune(self, now: float) -> None:
        for path, request in self._all():
            stale = request is None or request.expires_at + STALE_AFTER_SECONDS < now
            if stale and (request is not None or _older_than(path, STALE_AFTER_SECONDS, now)):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)

    # ------------------------------------------------------------------ user side

    def pending(self) -> list[ApprovalRequest]:
        """Requests still waiting for an answer, oldest first."""
        now = time.time()
        found = [
            r for _, r in self._all() if r is not None and r.decision is None and r.expires_at > now
        ]
        return sorted(found, key=lambda r: r.requested_at)

    def resolve(self, command_id: str) -> str:
        """The full command id for ``command_id`` or a unique prefix of a pending one."""
        if self._load(self._path(command_id)) is not None:
            return command_id
        matches = [r.command_id for r in self.pending() if r.command_id.startswith(command_id)]
        if len(matches) == 1 and command_id:
            return matches[0]
        if len(matches) > 1 and command_id:
            raise ApprovalError(
                f"{printable(command_id)} matches several pending requests"
                f" ({', '.join(printable(m) for m in matches)}); give more of the id"
            )
        raise ApprovalError(
            f"no approval request with id {printable(command_id)}; `endpointd approvals` lists"
            " the pending ones"
        )

    def decide(self, command_id: str, approve: bool) -> ApprovalRequest:
        """Answer a pending request; ApprovalError for an unknown, decided or expired one."""
        outcome: Outcome = "approved" if approve else "denied"
        with self._locked():
            full = self.resolve(command_id)
            request = self._load(self._path(full))
            if request is None:
                raise ApprovalError(
                    f"no approval request with id {printable(command_id)}; `endpointd"
                    " approvals` lists the pending ones"
                )
            if request.decision is not None:
                raise ApprovalError(
                    f"{printable(full)} was already {request.decision}"
                    f" {_ago(request.decided_at)}; nothing changed"
                )
            now = time.time()
            if request.expires_at <= now:
                raise ApprovalError(
                    f"{printable(full)} timed out {_ago(request.expires_at)} and was denied"
                )
            decided = ApprovalRequest(**{**asdict(request), "decision": outcome, "decided_at": now})
            self._save(decided)
            return decided


def _older_than(path: Path, seconds: float, now: float) -> bool:
    try:
        return path.stat().st_mtime + seconds < now
    except OSError:
        return False


def _ago(when: float | None) -> str:
    if when is None:
        return ""
    return f"{format_duration(time.time() - when)} ago"


def format_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def notify(request: ApprovalRequest) -> bool:
    """Show a desktop notification for ``request`` if ``notify-send`` (Linux) or
    ``osascript`` (macOS) exists; never blocks, never raises. True when one was started."""
    if os.environ.get(NO_NOTIFY_ENV):
        return False
    title = "endpointd: approval needed"
    body = (
        f"{printable(request.summary, 200)} (rule {printable(request.rule, 100)}). Run"
        f" `endpointd approve {printable(request.command_id, 80)}` or `endpointd deny …`."
    )
    argv: list[str] | None = None
    if sys.platform == "darwin" and shutil.which("osascript"):

        def applescript(s: str) -> str:
            return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'

        argv = [
            "osascript",
            "-e",
            f"display notification {applescript(body)} with title {applescript(title)}",
        ]
    elif shutil.which("notify-send"):
        argv = ["notify-send", "--app-name=endpointd", title, body]
    if argv is None:
        return False
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError:
        return False
    # Reaped in the background so a hung notifier neither blocks us nor lingers as a zombie.
    threading.Thread(target=_reap, args=(proc,), name="endpointd-notify", daemon=True).start()
    return True


def _reap(proc: subprocess.Popen[bytes]) -> None:
    try:
        proc.wait(NOTIFY_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
