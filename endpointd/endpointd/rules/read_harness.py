"""The policy's ``[harness]`` table: the harness this device prefers, the ones the control
plane may run here, how long a run's session store is kept, and per harness
(``[harness.NAME]``) its program, model, endpoint, credential and turn cap."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from endpointd.rules import environment
from endpointd.rules.credentials import NAME_RULE, valid_name
from endpointd.rules.harnesses import HARNESSES, NAMES
from endpointd.rules.reader import VARIABLE, Reader, expand_path
from endpointd.rules.tables import HarnessRules, HarnessSettings
from endpointd.rules.terms import HARNESS_DELIVERIES

_HARNESS_KEYS = ("default", "allowed", "keep_sessions_hours", *NAMES)
_HARNESS_ENTRY_KEYS = (
    "program",
    "model",
    "base_url",
    "credential",
    "credential_env",
    "delivery",
    "max_turns",
)
# An endpoint for an OpenAI-compatible harness: http(s), a host, no spaces or quotes.
_BASE_URL = re.compile(r"https?://[^\s\"'\\]+\Z")


def harness_rules(reader: Reader, data: Mapping[str, Any]) -> HarnessRules:
    raw = data.get("harness", {})
    if not isinstance(raw, dict):
        raise reader.fail("harness must be a [harness] table", None, "harness")
    _refuse_unknown(reader, raw)
    known = ", ".join(NAMES)
    default = raw.get("default", "")
    if not isinstance(default, str) or (default and default not in NAMES):
        raise reader.fail(
            f"harness.default must be one of {', '.join(map(repr, NAMES))}, got {default!r}",
            "harness",
            "default",
        )
    allowed = raw.get("allowed", [])
    if not isinstance(allowed, list) or not all(isinstance(a, str) and a in NAMES for a in allowed):
        raise reader.fail(
            f'harness.allowed must be a list of harness names ({known}), e.g. ["qwen"]',
            "harness",
            "allowed",
        )
    keep = raw.get("keep_sessions_hours", HarnessRules.keep_sessions_hours)
    if type(keep) is not int or keep < 0:
        raise reader.fail(
            "harness.keep_sessions_hours must be a whole number of hours (0: a run's session"
            f" store goes when the run ends), got {keep!r}",
            "harness",
            "keep_sessions_hours",
        )
    settings = {name: harness_settings(reader, name, raw[name]) for name in NAMES if name in raw}
    return HarnessRules(
        default=default, allowed=tuple(allowed), settings=settings, keep_sessions_hours=keep
    )


def _refuse_unknown(reader: Reader, raw: Mapping[str, Any]) -> None:
    """An unknown harness table or key, named with what endpointd knows instead."""
    known = ", ".join(NAMES)
    for key, value in raw.items():
        if key in _HARNESS_KEYS:
            continue
        if isinstance(value, dict):
            raise reader.fail(
                f"unknown harness {key!r} in [harness.{key}]; endpointd knows {known}",
                f"harness.{key}",
                None,
            )
        raise reader.fail(
            f"unknown key {key!r} in [harness]; known keys: default, allowed,"
            " keep_sessions_hours, and a"
            f" [harness.NAME] table per harness ({known})",
            "harness",
            key,
        )


def harness_settings(reader: Reader, name: str, raw: object) -> HarnessSettings:
    table = f"harness.{name}"
    if not isinstance(raw, dict):
        raise reader.fail(f"[{table}] must be a table", "harness", name)
    reader.unknown(raw, _HARNESS_ENTRY_KEYS, table)
    program = _program(reader, table, raw)
    model = _text(reader, table, raw, "model", 'a model name, e.g. "qwen3-coder-plus"')
    base_url = _base_url(reader, name, raw)
    credential = _text(reader, table, raw, "credential", "the name of a stored credential")
    if credential and not valid_name(credential):
        raise reader.fail(
            f"{table}.credential: invalid credential name {credential!r}: use {NAME_RULE}",
            table,
            "credential",
        )
    env_var = _credential_env(reader, name, raw, credential)
    delivery = _delivery(reader, table, raw, credential)
    max_turns = raw.get("max_turns", 0)
    if type(max_turns) is not int or ("max_turns" in raw and max_turns <= 0):
        raise reader.fail(
            f"{table}.max_turns must be a positive integer, got {max_turns!r}",
            table,
            "max_turns",
        )
    return HarnessSettings(
        program=program,
        model=model,
        base_url=base_url,
        credential=credential,
        credential_env=env_var or (HARNESSES[name].credential_env if credential else ""),
        delivery=delivery,
        max_turns=max_turns,
    )


def _text(
    reader: Reader, table: str, raw: Mapping[str, Any], key: str, what: str, spaces: bool = False
) -> str:
    """A string setting that cannot pass for a flag: not blank when set, no leading ``-``,
    no NUL, and (unless ``spaces``) no whitespace."""
    value = raw.get(key, "")
    if (
        not isinstance(value, str)
        or (key in raw and not value.strip())
        or value.startswith("-")
        or "\0" in value
        or (not spaces and any(c.isspace() for c in value))
    ):
        raise reader.fail(f"{table}.{key} must be {what}", table, key)
    return value


def _program(reader: Reader, table: str, raw: Mapping[str, Any]) -> Path | None:
    if "program" not in raw:
        return None
    written = _text(
        reader, table, raw, "program", "the absolute path of its executable", spaces=True
    )
    program = expand_path(written, reader.home)
    if not program.is_absolute():
        raise reader.fail(
            f"{table}.program: {written!r} is not an absolute path (write /… or ~/…)",
            table,
            "program",
        )
    return program


def _base_url(reader: Reader, name: str, raw: Mapping[str, Any]) -> str:
    table = f"harness.{name}"
    what = 'an http(s) URL, e.g. "https://api.example.com/v1"'
    base_url = _text(reader, table, raw, "base_url", what)
    if base_url and not HARNESSES[name].base_url:
        raise reader.fail(
            f"{table}.base_url: {HARNESSES[name].title} has no OpenAI-compatible endpoint"
            " to set; remove the key",
            table,
            "base_url",
        )
    if base_url and not _BASE_URL.match(base_url):
        raise reader.fail(
            f'{table}.base_url must be an http(s) URL, e.g. "https://api.example.com/v1",'
            f" got {base_url!r}",
            table,
            "base_url",
        )
    return base_url


def _credential_env(reader: Reader, name: str, raw: Mapping[str, Any], credential: str) -> str:
    """The variable the credential is delivered in: one that does not steer how programs
    start (:func:`endpointd.rules.environment.reserved`)."""
    table = f"harness.{name}"
    env_var = raw.get("credential_env", "")
    if not isinstance(env_var, str) or (
        "credential_env" in raw and (not VARIABLE.match(env_var) or environment.reserved(env_var))
    ):
        raise reader.fail(
            f"{table}.credential_env must be a variable name that does not steer how"
            f" programs start (default {HARNESSES[name].credential_env})",
            table,
            "credential_env",
        )
    if env_var and not credential:
        raise reader.fail(
            f"{table}.credential_env needs {table}.credential (the credential it delivers)",
            table,
            "credential_env",
        )
    return env_var


def _delivery(reader: Reader, table: str, raw: Mapping[str, Any], credential: str) -> str:
    delivery = raw.get("delivery", "env")
    if delivery not in HARNESS_DELIVERIES:
        raise reader.fail(
            f'{table}.delivery must be "env" or "http", got {delivery!r}', table, "delivery"
        )
    if delivery == "http" and not credential:
        raise reader.fail(
            f"{table}.delivery needs {table}.credential (the credential it delivers)",
            table,
            "delivery",
        )
    return str(delivery)
