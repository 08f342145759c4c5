"""Settings' units: every duration is named ``*_seconds`` and every size ``*_bytes``, and a
variable renamed for that keeps working for one release, with a warning naming its new name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any, get_args

import pytest
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from controlplane.settings import (
    BYTES,
    RENAMED,
    SECONDS,
    Settings,
    Unit,
    leaves,
    source_of,
    unknown_variables,
)

# old variable -> (new variable, the new field's path, how many seconds one old unit is)
RENAMES: dict[str, tuple[str, tuple[str, ...], float]] = {
    "SUPERAGENT_SHUTDOWN_TIMEOUT": (
        "SUPERAGENT_SHUTDOWN_TIMEOUT_SECONDS",
        ("shutdown_timeout_seconds",),
        1,
    ),
    "SUPERAGENT_HTTP__SESSION_HOURS": (
        "SUPERAGENT_HTTP__SESSION_SECONDS",
        ("http", "session_seconds"),
        3600,
    ),
    "SUPERAGENT_EFFECTS__POLL_INTERVAL": (
        "SUPERAGENT_EFFECTS__POLL_INTERVAL_SECONDS",
        ("effects", "poll_interval_seconds"),
        1,
    ),
    "SUPERAGENT_EFFECTS__BACKOFF_BASE": (
        "SUPERAGENT_EFFECTS__BACKOFF_BASE_SECONDS",
        ("effects", "backoff_base_seconds"),
        1,
    ),
    "SUPERAGENT_EFFECTS__BACKOFF_MAX": (
        "SUPERAGENT_EFFECTS__BACKOFF_MAX_SECONDS",
        ("effects", "backoff_max_seconds"),
        1,
    ),
    "SUPERAGENT_LLM__TIMEOUT": ("SUPERAGENT_LLM__TIMEOUT_SECONDS", ("llm", "timeout_seconds"), 1),
    "SUPERAGENT_LLM__IDLE_TIMEOUT": (
        "SUPERAGENT_LLM__IDLE_TIMEOUT_SECONDS",
        ("llm", "idle_timeout_seconds"),
        1,
    ),
    "SUPERAGENT_LLM__RETRY_CAP": (
        "SUPERAGENT_LLM__RETRY_CAP_SECONDS",
        ("llm", "retry_cap_seconds"),
        1,
    ),
    "SUPERAGENT_SLACK__TIMEOUT": (
        "SUPERAGENT_SLACK__TIMEOUT_SECONDS",
        ("slack", "timeout_seconds"),
        1,
    ),
    "SUPERAGENT_MATRIX__SYNC_TIMEOUT": (
        "SUPERAGENT_MATRIX__SYNC_TIMEOUT_SECONDS",
        ("matrix", "sync_timeout_seconds"),
        1,
    ),
    "SUPERAGENT_MATRIX__TIMEOUT": (
        "SUPERAGENT_MATRIX__TIMEOUT_SECONDS",
        ("matrix", "timeout_seconds"),
        1,
    ),
    "SUPERAGENT_LARK__TIMEOUT": (
        "SUPERAGENT_LARK__TIMEOUT_SECONDS",
        ("lark", "timeout_seconds"),
        1,
    ),
    "SUPERAGENT_WATCHDOG__STALL_MINUTES": (
        "SUPERAGENT_WATCHDOG__STALL_SECONDS",
        ("watchdog", "stall_seconds"),
        60,
    ),
    "SUPERAGENT_WATCHDOG__DRIFT_MINUTES": (
        "SUPERAGENT_WATCHDOG__DRIFT_SECONDS",
        ("watchdog", "drift_seconds"),
        60,
    ),
}


def _value(settings: Settings, path: tuple[str, ...]) -> Any:
    found: Any = settings
    for part in path:
        found = getattr(found, part)
    return found


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.startswith("SUPERAGENT_"):
            monkeypatch.delenv(name)
    return monkeypatch


@pytest.mark.parametrize("old", sorted(RENAMES))
def test_a_renamed_variable_is_honoured_with_a_warning_naming_the_new_one(
    clean_env: pytest.MonkeyPatch, old: str
) -> None:
    new, path, factor = RENAMES[old]
    clean_env.setenv(old, "0.25")
    assert _value(Settings(), path) == pytest.approx(0.25 * factor)
    [warning] = unknown_variables(os.environ)
    assert warning.startswith(f"{old} is deprecated: use {new}"), warning
    assert "ignored" not in warning
    assert source_of([new], os.environ) == old

    clean_env.setenv(new, "0.5")  # both set: the new one wins, the old one is ignored
    assert _value(Settings(), path) == 0.5
    [warning] = unknown_variables(os.environ)
    assert warning.startswith(f"{old} is deprecated and ignored: {new} is set"), warning
    assert source_of([new], os.environ) == new


def test_an_old_unit_is_converted_and_the_warning_says_so(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("SUPERAGENT_WATCHDOG__STALL_MINUTES", "2")
    clean_env.setenv("SUPERAGENT_HTTP__SESSION_HOURS", "1.5")
    settings = Settings()
    assert settings.watchdog.stall_seconds == 120
    assert settings.http.session_seconds == 5400
    assert unknown_variables(os.environ) == [
        "SUPERAGENT_HTTP__SESSION_HOURS is deprecated: use SUPERAGENT_HTTP__SESSION_SECONDS "
        "(in seconds; 1.5 hours is read as 5400 seconds until then)",
        "SUPERAGENT_WATCHDOG__STALL_MINUTES is deprecated: use "
        "SUPERAGENT_WATCHDOG__STALL_SECONDS (in seconds; 2 minutes is read as 120 seconds "
        "until then)",
    ]


def test_an_old_variable_that_is_not_a_number_is_one_clear_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUPERAGENT_")}
    env["SUPERAGENT_STATE_DIR"] = str(tmp_path)
    env["SUPERAGENT_WATCHDOG__DRIFT_MINUTES"] = "soon"
    done = subprocess.run(
        [sys.executable, "-m", "controlplane.cli", "config", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 1, done
    assert "SUPERAGENT_WATCHDOG__DRIFT_MINUTES" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_the_cli_warns_and_runs_with_the_old_variables_value(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUPERAGENT_")}
    env["SUPERAGENT_STATE_DIR"] = str(tmp_path)
    env["SUPERAGENT_LLM__TIMEOUT"] = "42"
    env["SUPERAGENT_SLACK__TIMEOUT"] = "3"
    env["SUPERAGENT_SLACK__TIMEOUT_SECONDS"] = "4"
    done = subprocess.run(
        [sys.executable, "-m", "controlplane.cli", "config", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    values = json.loads(done.stdout)
    assert values["llm"]["timeout_seconds"] == 42
    assert values["slack"]["timeout_seconds"] == 4
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning: ")]
    assert warnings == [
        "warning: SUPERAGENT_LLM__TIMEOUT is deprecated: use SUPERAGENT_LLM__TIMEOUT_SECONDS "
        "(its value is used until then)",
        "warning: SUPERAGENT_SLACK__TIMEOUT is deprecated and ignored: "
        "SUPERAGENT_SLACK__TIMEOUT_SECONDS is set",
    ], done.stderr


def _leaves(model: type[BaseModel] = Settings, prefix: str = "") -> list[tuple[str, FieldInfo]]:
    found: list[tuple[str, FieldInfo]] = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            found += _leaves(annotation, f"{prefix}{name}.")
        else:
            found.append((f"{prefix}{name}", field))
    return found


def _unit(field: FieldInfo) -> Unit | None:
    units = [item for item in field.metadata if isinstance(item, Unit)]
    assert len(units) <= 1, units
    return units[0] if units else None


def _numeric(annotation: Any) -> bool:
    """A number, maybe optional; a timedelta counts too (durations are seconds here)."""
    kinds = set(get_args(annotation)) or {annotation}
    return bool(kinds & {int, float, timedelta})


# Every number a setting holds that is neither a duration nor a size, and what it counts.
# A new number must be declared `Seconds`/`Bytes` or be listed here: none goes unclassified.
UNITLESS_NUMBERS = {
    "http.port": "a port",
    "http.signin_attempts": "attempts",
    "grpc.port": "a port",
    "grpc.max_streams": "streams",
    "grpc.max_streams_per_peer": "streams",
    "grpc.pairing_failures_per_peer": "attempts",
    "grpc.pairing_failures_global": "attempts",
    "effects.concurrency": "effects",
    "effects.batch_size": "effects",
    "effects.max_attempts": "attempts",
    "llm.router_max_tokens": "tokens",
    "llm.worker_max_tokens": "tokens",
    "llm.watchdog_max_tokens": "tokens",
    "llm.summary_max_tokens": "tokens",
    "llm.attempts": "attempts",
    "llm.router_context_tokens": "tokens",
    "llm.worker_context_tokens": "tokens",
    "llm.compact_share": "a share of the context window",
    "workers.max_workers": "workers",
    "workers.max_turns": "model calls",
    "workers.token_budget": "tokens",
    "workers.repeat_limit": "tool calls",
    "workers.failed_rounds_limit": "rounds",
    "workers.ci_fix_rounds_limit": "rounds",
    "workers.bot_rounds_limit": "rounds",
    "workers.harness_max_turns": "agent turns",
    "workers.harness_fix_rounds": "rounds",
    "router.quarantine_after": "failed turns",
    "watchdog.error_streak": "failed calls",
    "watchdog.pause_after_errors": "failed calls",
}
# Words that say a number is a time: such a setting must be a `Seconds`.
TIME_WORDS = (
    "timeout", "interval", "delay", "wait", "grace", "ttl", "age", "period", "backoff",
    "lease", "renew", "expir", "session", "window", "hours", "minutes", "_ms", "retry_cap",
    "stall", "drift", "silence", "notice",
)  # fmt: skip
# (not "size": batch_size counts effects)
SIZE_WORDS = ("_kb", "_mb", "_gb", "bytes", "body", "header", "message")


def test_every_duration_is_seconds_and_every_size_bytes_by_its_type() -> None:
    """A duration is declared ``Seconds`` and named ``*_seconds``, a size ``Bytes`` and
    ``*_bytes``: the type and the name agree both ways, and every other number is a count
    listed above, so that a new setting cannot slip in with a unit-less name."""
    numbers = set()
    for path, field in _leaves():
        unit, name = _unit(field), path.rsplit(".", 1)[-1]
        for known in (SECONDS, BYTES):
            if unit == known:
                assert name.endswith(known.suffix), f"{path} is {known}: name it *{known.suffix}"
            else:
                assert not name.endswith(known.suffix), f"{path}: declare it as {known}"
        if unit is None and _numeric(field.annotation):
            numbers.add(path)
            assert path in UNITLESS_NUMBERS, (
                f"{path} is a number without a unit: declare it Seconds (a duration), Bytes "
                "(a size), or list it in UNITLESS_NUMBERS with what it counts"
            )
            assert not any(word in name for word in TIME_WORDS), f"{path} looks like a time"
            assert not any(word in name for word in SIZE_WORDS), f"{path} looks like a size"
    assert numbers == set(UNITLESS_NUMBERS), "UNITLESS_NUMBERS names a setting no more"


def test_the_durations_and_sizes_are_found() -> None:
    """The test above stands on the walk and the markers: they must reach nested sections."""
    units = {path: _unit(field) for path, field in _leaves()}
    assert units["llm.timeout_seconds"] == SECONDS
    assert units["workers.harness_timeout_seconds"] == SECONDS  # whole seconds
    assert units["shutdown_timeout_seconds"] == SECONDS
    assert units["http.max_body_bytes"] == BYTES
    assert units["llm.max_text_bytes"] == BYTES
    assert units["llm.router_context_tokens"] is None  # tokens are counts, not bytes
    assert sum(unit == SECONDS for unit in units.values()) >= 30


def test_every_renamed_variable_is_listed_in_the_settings() -> None:
    assert {old: new for old, (new, _, _) in RENAMES.items()} == {
        old: renamed.new for old, renamed in RENAMED.items()
    }
    assert {old: factor for old, (_, _, factor) in RENAMES.items()} == {
        old: renamed.per_unit for old, renamed in RENAMED.items()
    }
    variables = {names[0] for _, names in leaves()}
    for old, renamed in RENAMED.items():
        assert renamed.new in variables, renamed
        assert old not in variables, old
