"""Settings: environment names, validation, secrets, and docs/configuration.md's table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError

from controlplane.settings import (
    Settings,
    describe,
    markdown_table,
    secret_leaves,
    unknown_variables,
)
from superagent_shared.ids import ALPHABET, RANDOM_LENGTH, id_prefix, new_id
from tests.conftest import REPO

TABLE_BEGIN = "<!-- BEGIN generated: superagent config --markdown -->\n"
TABLE_END = "<!-- END generated -->"


def test_the_configuration_page_lists_every_setting() -> None:
    page = (REPO / "docs" / "configuration.md").read_text()
    assert TABLE_BEGIN in page, "the table's first marker is gone"
    assert TABLE_END in page, "the table's last marker is gone"
    table = page.split(TABLE_BEGIN, 1)[1].split(TABLE_END, 1)[0]
    assert table == markdown_table(), (
        "docs/configuration.md's table is stale: paste `superagent config --markdown` "
        "between its markers"
    )


def test_every_setting_is_described() -> None:
    for line in markdown_table().splitlines()[2:]:
        assert line.split("|")[3].strip(), line


def test_environment_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://u@h/db")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("SUPERAGENT_EFFECTS__CONCURRENCY", "7")
    monkeypatch.setenv("SUPERAGENT_HTTP__PORT", "9999")
    settings = Settings()
    assert settings.database_url == "postgresql://u@h/db"
    assert settings.openai_base_url == "http://127.0.0.1:9/v1"
    assert settings.openai_api_key is not None
    assert settings.openai_api_key.get_secret_value() == "sk-test"
    assert "sk-test" not in repr(settings)
    assert settings.effects.concurrency == 7
    assert settings.http.port == 9999
    assert settings.model_configured


def test_bad_values_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SUPERAGENT_EFFECTS__POLL_INTERVAL_SECONDS", "5")
    with pytest.raises(ValidationError, match="poll_interval_seconds"):
        Settings()


@pytest.mark.parametrize("token", ["changeme", "SECRET", "password"])
def test_production_refuses_placeholders(monkeypatch: pytest.MonkeyPatch, token: str) -> None:
    monkeypatch.setenv("SUPERAGENT_ENVIRONMENT", "production")
    monkeypatch.setenv("SUPERAGENT_ADMIN_TOKEN", token)
    with pytest.raises(ValidationError, match="placeholder"):
        Settings()


def test_production_requires_an_admin_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SUPERAGENT_ENVIRONMENT", "production")
    monkeypatch.delenv("SUPERAGENT_ADMIN_TOKEN", raising=False)
    with pytest.raises(ValidationError, match="ADMIN_TOKEN"):
        Settings()
    monkeypatch.setenv("SUPERAGENT_ADMIN_TOKEN", "  ")  # set, but to nothing
    with pytest.raises(ValidationError, match="ADMIN_TOKEN"):
        Settings()
    monkeypatch.setenv("SUPERAGENT_ADMIN_TOKEN", "a-real-long-random-token-4d9f-0c7e1b2a")
    assert Settings().admin_token is not None


def test_ids_are_prefixed_short_and_random() -> None:
    ids = {new_id("tkt") for _ in range(2000)}
    assert len(ids) == 2000
    for value in list(ids)[:50]:
        prefix, random_part = value.split("_")
        assert prefix == "tkt"
        assert len(random_part) == RANDOM_LENGTH
        assert set(random_part) <= set(ALPHABET)
        assert id_prefix(value) == "tkt"
    assert id_prefix("tkt_short") is None
    assert id_prefix("zzz_" + "0" * RANDOM_LENGTH) is None
    with pytest.raises(ValueError, match="unknown id prefix"):
        new_id("nope")


def test_a_mistyped_variable_is_named_with_the_setting_it_was_meant_for(tmp_path: Path) -> None:
    """Once ignored in silence: `SUPERAGENT_EFECTS__CONCURRENCY=5` ran with the default."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SUPERAGENT_")},
        "SUPERAGENT_EFECTS__CONCURRENCY": "5",
        "SUPERAGENT_WORKERS__PRICES__INPUT_USD_PER_MTOK": "2.5",  # moved
        "SUPERAGENT_QQQ": "1",  # close to nothing
        "SUPERAGENT_DATABASE_URL": "postgresql://u@h/db",  # an alias: a setting
        "SUPERAGENT_REAL_MODEL_CACHE": str(tmp_path),  # the test tier's, not a setting
        "SUPERAGENT_STATE_DIR": str(tmp_path),
    }
    done = subprocess.run(
        [sys.executable, "-m", "controlplane.cli", "config", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["effects"]["concurrency"] != 5
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning: ")]
    assert warnings == [
        "warning: SUPERAGENT_EFECTS__CONCURRENCY is not a setting and is ignored "
        "(did you mean SUPERAGENT_EFFECTS__CONCURRENCY?)",
        "warning: SUPERAGENT_QQQ is not a setting and is ignored",
        "warning: SUPERAGENT_WORKERS__PRICES__INPUT_USD_PER_MTOK is no longer a setting: "
        "use SUPERAGENT_LLM__PRICES (prices by model, as JSON)",
    ], done.stderr


# What a secret's value must look like, and the settings that must come with some.
SHAPES = {
    ("slack", "bot_token"): "xoxb-",
    ("slack", "app_token"): "xapp-",
    ("database_url",): "postgresql://agent:",
}
COMPANIONS = {
    "SUPERAGENT_MATRIX__HOMESERVER": "https://matrix.example.com",
    "SUPERAGENT_MATRIX__USER_ID": "@agent:example.com",
    "SUPERAGENT_LARK__APP_ID": "cli_a1b2c3",
}


def test_every_secret_can_come_from_a_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Docker and Kubernetes hand secrets over as files: each secret setting reads
    ``<VARIABLE>_FILE`` (once only GitHub's App key could)."""
    for variable, companion in COMPANIONS.items():
        monkeypatch.setenv(variable, companion)
    leaves = secret_leaves()
    # The admin token, the model's key, the database URL, GitHub's, Slack's, Matrix's, Lark's.
    assert len(leaves) >= 14
    expected: dict[tuple[str, ...], str] = {}
    for i, (path, names) in enumerate(leaves):
        variable = names[0] + "_FILE"
        if variable in {env for env, _, _ in describe()}:
            continue  # GitHub's private_key_file: a path setting of its own
        value = SHAPES.get(path, "") + f"secret-{i}-" + "x" * 40
        secret = tmp_path / f"{i}.txt"
        secret.write_text(value + "\n")  # as `echo … > file` writes it
        monkeypatch.setenv(variable, str(secret))
        expected[path] = value
    settings = Settings()
    for path, value in expected.items():
        found: Any = settings
        for part in path:
            found = getattr(found, part)
        assert found is not None, path
        read = found.get_secret_value() if isinstance(found, SecretStr) else found
        assert read == value, path
    assert unknown_variables(os.environ) == []  # the _FILE names are known


def test_a_secret_file_that_cannot_be_read_or_doubles_its_variable_is_one_clear_line(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUPERAGENT_")}
    env["SUPERAGENT_STATE_DIR"] = str(tmp_path)
    cases = {
        "cannot read SUPERAGENT_ADMIN_TOKEN_FILE": {
            "SUPERAGENT_ADMIN_TOKEN_FILE": str(tmp_path / "missing")
        },
        "set SUPERAGENT_ADMIN_TOKEN or SUPERAGENT_ADMIN_TOKEN_FILE, not both": {
            "SUPERAGENT_ADMIN_TOKEN": "y" * 40,
            "SUPERAGENT_ADMIN_TOKEN_FILE": str(tmp_path),
        },
    }
    for said, extra in cases.items():
        done = subprocess.run(
            [sys.executable, "-m", "controlplane.cli", "config", "--json"],
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
        assert done.returncode == 1, done
        assert done.stderr.startswith(f"error: {said}"), done.stderr
        assert "Traceback" not in done.stderr


def test_a_bad_log_format_warns_and_runs_on_plain_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/operations.md: a wrong format is logged once and plain lines kept; the setting
    once refused it instead, and every command exited 1."""
    monkeypatch.setenv("SUPERAGENT_LOG_FORMAT", "xml")
    assert Settings().log_format == "plain"
    monkeypatch.setenv("SUPERAGENT_LOG_FORMAT", " JSON ")
    assert Settings().log_format == "json"
