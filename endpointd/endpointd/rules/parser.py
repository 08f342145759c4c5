"""``policy.toml`` read into :class:`~endpointd.rules.tables.Rules`: :func:`parse_policy`.

Every key is validated, and an unknown key is an error rather than ignored (a typo must not
silently mean the default). The error names the file, the line and the key
(:class:`~endpointd.rules.errors.PolicyError`). The top-level keys are read here; each
table with more to it has its own reader: the rule lists (:mod:`~endpointd.rules.read_lists`),
``[credentials.NAME]`` (:mod:`~endpointd.rules.read_credentials`), ``[workspaces]``
(:mod:`~endpointd.rules.read_workspaces`) and ``[harness]``
(:mod:`~endpointd.rules.read_harness`).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from endpointd.rules.credentials import STORES, Store
from endpointd.rules.errors import PolicyError
from endpointd.rules.read_credentials import credential_scopes
from endpointd.rules.read_harness import harness_rules
from endpointd.rules.read_lists import command_rules, file_rules
from endpointd.rules.read_workspaces import workspace_rules
from endpointd.rules.reader import Reader
from endpointd.rules.tables import (
    CredentialScope,
    DeniedPath,
    EnvRules,
    HarnessRules,
    Limits,
    Rules,
)
from endpointd.rules.terms import (
    ACTIONS,
    NETWORK_MODES,
    SANDBOX_MODES,
    Action,
    NetworkMode,
    SandboxMode,
)

_TOP_KEYS = (
    "allowed_roots",
    "denied_paths",
    "writable_paths",
    "readable_paths",
    "program_paths",
    "default_action",
    "sandbox",
    "network",
    "proxy",
    "env",
    "commands",
    "files",
    "credentials",
    "credential_store",
    "limits",
    "workspaces",
    "harness",
)
_PROXY_KEYS = ("allow_hosts",)
_ENV_KEYS = ("pass", "allow")
_LIMIT_KEYS = ("max_runtime_seconds", "max_output_bytes", "ask_timeout_seconds")


def parse_policy(text: str, path: Path, home: Path | None = None) -> Rules:
    """Validate a policy file's text; PolicyError naming the key and line."""
    reader = Reader(path, text, Path.home() if home is None else home)
    data = _toml(reader)
    reader.unknown(data, _TOP_KEYS, None)

    roots = tuple(p for _, p in reader.path_list(data, "allowed_roots"))
    denied = tuple(
        DeniedPath(label=raw, path=p, default=False)
        for raw, p in reader.path_list(data, "denied_paths")
    )
    writable = tuple(p for _, p in reader.path_list(data, "writable_paths"))
    # Absent: the built-in toolchain grants (endpointd.guard.view.HOME_TOOLCHAINS).
    readable = (
        tuple(p for _, p in reader.path_list(data, "readable_paths"))
        if "readable_paths" in data
        else None
    )
    program_paths = tuple(p for _, p in reader.path_list(data, "program_paths"))
    default_action = reader.choice(data, "default_action", ACTIONS, "allow")
    sandbox = reader.choice(data, "sandbox", SANDBOX_MODES, "required")
    network = reader.choice(data, "network", NETWORK_MODES, "allow")
    proxy_hosts = reader.hosts(reader.table(data, "proxy", _PROXY_KEYS), "allow_hosts", "proxy")
    env_raw = reader.table(data, "env", _ENV_KEYS)
    env = EnvRules(passed=reader.names(env_raw, "pass"), allow=reader.names(env_raw, "allow"))
    files = file_rules(reader, data)
    workspaces = workspace_rules(reader, data)
    harness = harness_rules(reader, data)
    commands = command_rules(reader, data)
    scopes = credential_scopes(reader, data)
    limits = _limits(reader, data)
    credential_store = _credential_store(reader, data)
    _check_http_deliveries(reader, harness, scopes)

    return Rules(
        allowed_roots=roots,
        denied_paths=denied,
        default_action=cast(Action, default_action),
        commands=commands,
        credentials=scopes,
        limits=limits,
        sandbox=cast(SandboxMode, sandbox),
        network=cast(NetworkMode, network),
        proxy_hosts=proxy_hosts,
        writable_paths=writable,
        readable_paths=readable,
        program_paths=program_paths,
        env=env,
        files=files,
        workspaces=workspaces,
        harness=harness,
        credential_store=credential_store,
    )


def _toml(reader: Reader) -> dict[str, Any]:
    try:
        return tomllib.loads(reader.text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"at line (\d+)", str(exc))
        # "at end of document": the error is on the last line (e.g. an unclosed array).
        line = int(m.group(1)) if m else max(1, len(reader.text.splitlines()))
        raise PolicyError(reader.path, f"not valid TOML: {exc}", line) from None


def _limits(reader: Reader, data: Mapping[str, Any]) -> Limits:
    raw = data.get("limits", {})
    if not isinstance(raw, dict):
        raise reader.fail("limits must be a [limits] table", None, "limits")
    reader.unknown(raw, _LIMIT_KEYS, "limits")
    values: dict[str, int] = {}
    for key in _LIMIT_KEYS:
        if key in raw:
            value = raw[key]
            if type(value) is not int or value <= 0:
                raise reader.fail(
                    f"limits.{key} must be a positive integer, got {value!r}", "limits", key
                )
            values[key] = value
    return Limits(**values)


def _credential_store(reader: Reader, data: Mapping[str, Any]) -> Store | None:
    """Where `endpointd creds add` puts new values; None when the file does not say."""
    if "credential_store" not in data:
        return None
    return cast(Store, reader.choice(data, "credential_store", STORES, "keyring"))


def _check_http_deliveries(
    reader: Reader, harness: HarnessRules, scopes: Mapping[str, CredentialScope]
) -> None:
    for name, settings in harness.settings.items():
        # The proxy adds the key only for the credential's own hosts: without them it
        # would go nowhere, and the run would fail later with a less useful error.
        if settings.delivery == "http" and not (
            settings.credential in scopes and scopes[settings.credential].hosts
        ):
            raise reader.fail(
                f'harness.{name}.delivery = "http" needs [credentials.{settings.credential}]'
                f' with hosts = ["…"] (the hosts of the harness\'s endpoint, where the'
                " device's proxy adds the key) and allow = [] (no other program gets it)",
                f"harness.{name}",
                "delivery",
            )
