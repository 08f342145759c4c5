"""The last result of `endpointd sandbox check`, kept in the state dir.

Written by the check (:mod:`endpointd.sandboxcheck.check`), read by `endpointd status` and
by `superagent doctor` for the machine's own device (`superagent up --device`), so that
"is the sandbox holding here?" has an answer without running anything. The file,
``<state dir>/sandbox-check.json`` (0600), holds when it ran, the policy hash it ran under
(the same hash the device reports: the file and the sandbox mode in effect), the sandbox
line, and per probe class its outcome, the probes that escaped and the fix.

Outcomes: ``contained`` (no probe of the class got through), ``escaped`` (one did),
``allowed`` (the policy itself lets commands do it: egress under ``network = "allow"``),
``error`` (the probes could not run, so nothing is known).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from endpointd.errors import EndpointdError
from endpointd.fsutil import atomic_write

FILE = "sandbox-check.json"
VERSION = 1
OUTCOMES = ("contained", "escaped", "allowed", "error")


class CheckRecordError(EndpointdError):
    """The saved result cannot be read."""


@dataclass(frozen=True)
class ClassResult:
    name: str
    outcome: str  # one of OUTCOMES
    escaped: tuple[str, ...] = ()  # what the escaped probes tried
    fix: str = ""
    detail: str = ""  # for allowed and error: why

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "outcome": self.outcome,
            "escaped": list(self.escaped),
            "fix": self.fix,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class CheckResult:
    checked_at: str  # ISO 8601, UTC
    policy_sha256: str
    sandbox: str
    classes: tuple[ClassResult, ...]

    @property
    def escaped(self) -> list[str]:
        return [c.name for c in self.classes if c.outcome == "escaped"]

    @property
    def errors(self) -> list[str]:
        return [c.name for c in self.classes if c.outcome == "error"]

    @property
    def passed(self) -> bool:
        return not self.escaped and not self.errors

    def summary(self) -> str:
        """One line: the verdict, the classes that escaped, when and under which policy."""
        when = f"at {self.checked_at}, policy {self.policy_sha256[:12]}"
        if self.escaped:
            return f"ESCAPED: {', '.join(self.escaped)} ({when})"
        if self.errors:
            return f"could not check: {', '.join(self.errors)} ({when})"
        allowed = [c.name for c in self.classes if c.outcome == "allowed"]
        also = f"; allowed by the policy: {', '.join(allowed)}" if allowed else ""
        return f"contained{also} ({when})"

    def to_json(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "checked_at": self.checked_at,
            "policy_sha256": self.policy_sha256,
            "sandbox": self.sandbox,
            "passed": self.passed,
            "classes": [c.to_json() for c in self.classes],
        }

    @classmethod
    def from_json(cls, raw: Any) -> CheckResult:
        try:
            classes = tuple(
                ClassResult(
                    name=str(c["name"]),
                    outcome=str(c["outcome"]) if c["outcome"] in OUTCOMES else "error",
                    escaped=tuple(str(e) for e in c.get("escaped", ())),
                    fix=str(c.get("fix", "")),
                    detail=str(c.get("detail", "")),
                )
                for c in raw["classes"]
            )
            return cls(
                checked_at=str(raw["checked_at"]),
                policy_sha256=str(raw["policy_sha256"]),
                sandbox=str(raw.get("sandbox", "")),
                classes=classes,
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise CheckRecordError(f"malformed ({type(exc).__name__}: {exc})") from None


def save(state_directory: Path, result: CheckResult) -> Path:
    path = state_directory / FILE
    state_directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    atomic_write(path, json.dumps(result.to_json(), indent=2).encode(), mode=0o600)
    return path


def load(state_directory: Path) -> CheckResult | None:
    """The last result; None when the check never ran here; CheckRecordError when the
    file is unreadable or malformed (the message names it)."""
    path = state_directory / FILE
    try:
        raw = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise CheckRecordError(f"{path}: unreadable ({exc})") from None
    try:
        return CheckResult.from_json(raw)
    except CheckRecordError as exc:
        raise CheckRecordError(f"{path}: {exc}") from None


def describe(
    state_directory: Path, current_policy_sha256: str | None
) -> tuple[str, dict[str, Any]]:
    """What `endpointd status` and `superagent doctor` show of the last check: one line,
    and the same as JSON (``ran``, ``passed``, ``stale``, the classes…). ``stale``: the
    policy hash has changed since, so the result may no longer hold."""
    try:
        result = load(state_directory)
    except CheckRecordError as exc:
        return f"unreadable: {exc} (run `endpointd sandbox check` again)", {
            "ran": False,
            "error": str(exc),
        }
    if result is None:
        return "never run (`endpointd sandbox check` tries to escape the sandbox here)", {
            "ran": False
        }
    stale = bool(current_policy_sha256) and current_policy_sha256 != result.policy_sha256
    line = result.summary()
    if stale:
        line += "; the policy has changed since: run `endpointd sandbox check` again"
    return line, {**result.to_json(), "ran": True, "stale": stale}
