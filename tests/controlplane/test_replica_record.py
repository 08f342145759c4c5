"""What a replica records about itself (``replicas.runs_with``) holds none of its secrets.

Every secret field the settings have, found by walking the settings tree (so a secret added
later is covered without editing this test), is set to a canary; so are the parts of the
model's URL and the database URL where credentials can hide. The record and the status
CLI's view of the shell must name the endpoint's host and nothing else of those.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import pytest
from pydantic import BaseModel, SecretStr

from controlplane.cli.status import _shell
from controlplane.deployment import model_phrase
from controlplane.heartbeat import Record, endpoint_host
from controlplane.settings import Settings

CANARY = "canary-5e81b07d"


def _with_canaries(model: BaseModel, path: str = "") -> tuple[BaseModel, list[str]]:
    """``model`` with every SecretStr field set to a canary naming it (validators skipped:
    the combinations need not be coherent), and the names of the fields set."""
    updates: dict[str, Any] = {}
    named: list[str] = []
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            updates[name], inner = _with_canaries(value, f"{path}{name}.")
            named += inner
        elif "SecretStr" in str(field.annotation):
            updates[name] = SecretStr(f"{CANARY}-{path}{name}")
            named.append(f"{path}{name}")
    return model.model_copy(update=updates), named


def _settings() -> tuple[Settings, list[str]]:
    base = Settings(
        openai_base_url=f"https://agent:{CANARY}@models.example:8443/v1/{CANARY}?key={CANARY}#{CANARY}",
        database_url=f"postgresql://app:{CANARY}@db.example:6543/agent?sslpassword={CANARY}",
    )
    settings, named = _with_canaries(base)
    assert isinstance(settings, Settings)
    return settings, named


def test_the_walk_finds_the_known_secrets() -> None:
    """The test below stands on the walk: it must reach nested sections' secrets."""
    settings, named = _settings()
    for known in ("openai_api_key", "admin_token", "slack.bot_token", "matrix.password"):
        assert known in named
    assert settings.slack.bot_token is not None
    assert CANARY in settings.slack.bot_token.get_secret_value()


def test_no_secret_reaches_the_record_or_the_shell_line() -> None:
    settings, _ = _settings()
    record = Record.of(settings, ["slack", "webchat"])
    stored = json.dumps(record.runs_with()) + json.dumps(asdict(record))
    assert record.model_host == "models.example:8443"  # the record says something
    assert CANARY not in stored
    assert CANARY not in model_phrase(record.runs_with())
    shell = _shell(settings)
    assert shell.database == "agent on db.example:6543"
    assert CANARY not in json.dumps(asdict(shell))


@pytest.mark.parametrize(
    ("url", "host"),
    [
        (None, "api.openai.com"),
        ("http://127.0.0.1:9/v1", "127.0.0.1:9"),
        ("https://user:pw@[::1]:8000/v1?k=v", "[::1]:8000"),
        ("https://host.example/v1", "host.example"),
        ("http://host:notaport/v1", "unparsable URL"),
        ("not a url", "unparsable URL"),
    ],
)
def test_endpoint_host_keeps_only_host_and_port(url: str | None, host: str) -> None:
    assert endpoint_host(url) == host
