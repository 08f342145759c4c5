"""Settings' units: every duration is named ``*_seconds`` and every size ``*_bytes``, and a
variable renamed for that keeps working for one release, with a warning naming its new name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from controlplane.settings import Settings, source_of, unknown_variables

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
