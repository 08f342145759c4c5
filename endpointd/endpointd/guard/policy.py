"""The local policy: the one place every command passes before it may run.

The policy file, ``<config dir>/policy.toml``, is the machine owner's: no RPC can change
it. It says where commands may run and files may be touched (``allowed_roots``, minus
``denied_paths``), which commands are allowed, denied or held for a local approval
(``[[commands]]``, first match wins, else ``default_action``), which commands may receive
each credential (``[credentials.NAME] allow``), which repositories get a ticket workspace
and how long it is kept (``[workspaces]``), which coding-agent CLIs the control plane may
run here and with what (``[harness]``), and the limits (``[limits]``). The shipped
``policy.example.toml`` documents every key.

How it is enforced:

* :meth:`Policy.check` judges a command: paths first (allowed roots, denied paths), then
  the command rules, then the credential scopes; deny beats ask beats allow. Every
  :class:`Decision` names the rule that decided, as the policy file names it.
* A missing, unreadable, malformed or loosely-permissioned file refuses every command
  (except cancel, which only ever stops work) with a message naming the file and line:
  a broken policy must never mean "allow everything".
* The file is re-read whenever it changes (one ``stat`` per check), so edits apply without
  a restart and :meth:`Policy.hash` (reported in every Hello) always describes the rules
  being enforced.

The policy says what the control plane may ask for; the OS sandbox
(:mod:`endpointd.guard.sandbox`) is what holds an allowed command to it once it runs: the
denied paths unreadable, writes only in its workspace, no view of other processes, the
network as ``network`` says. The argv check against denied paths is only a courtesy (a
clear refusal up front); the kernel is the boundary.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import json
import os
import re
import shutil
import sys
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar, Literal, cast

from endpointd.errors import ConfigError
from endpointd.fsutil import atomic_write
from endpointd.guard import environment, sandbox
from endpointd.guard.files import fold as _fold
from endpointd.guard.files import within as _within
from endpointd.guard.programs import code_running_reason, resolve_program, scope_matches
from endpointd.harness.table import HARNESSES, NAMES
from endpointd.paths import data_dir, ensure_private_dir, state_dir
from endpointd.secrets.file_store import DIRECTORY as CREDENTIAL_FILES_DIR
from endpointd.secrets.store import NAME_RULE, STORES, Store, valid_name
from endpointd.workspaces.remotes import remote_of
from superagent_shared.messages import (
    Command,
    Exec,
    Glob,
    HarnessExec,
    ListDir,
    PrepareWorkspace,
    ReadFile,
    Reason,
    ReleaseWorkspace,
    RunHarness,
    Search,
    WriteFile,
)

POLICY_FILE = "policy.toml"
EXAMPLE_FILE = "policy.example.toml"

Action = Literal["allow", "deny", "ask"]
ACTIONS: tuple[Action, ...] = ("allow", "deny", "ask")
SandboxMode = Literal["required", "best-effort", "off"]
SANDBOX_MODES: tuple[SandboxMode, ...] = ("required", "best-effort", "off")
NetworkMode = Literal["allow", "deny", "proxy"]
NETWORK_MODES: tuple[NetworkMode, ...] = ("allow", "deny", "proxy")
FileOp = Literal["read", "write", "list"]
FILE_OPS: tuple[FileOp, ...] = ("read", "write", "list")
# How an http-delivered credential is added to requests for its hosts ({secret}: the value).
DEFAULT_HEADER = "Authorization: Bearer {secret}"

# Always denied, whatever the file says (user entries add to these).
DEFAULT_DENIED_PATHS = (
    # Keys and cloud credentials.
    "~/.ssh",
    "~/.gnupg",
    "~/.aws",
    "~/.azure",
    "~/.config/gcloud",
    "~/.kube",
    "~/.docker/config.json",
    "~/.netrc",
    "~/.git-credentials",
    "~/.config/gh",
    "~/.pypirc",
    "~/.vault-token",
    "~/.password-store",
    # Keyring stores.
    "~/Library/Keychains",
    "~/.local/share/keyrings",
    "~/.local/share/kwalletd",
    # keyrings.alt's file-based keyrings, should that be the backend in use.
    "~/.local/share/python_keyring",
    # Browser profiles: cookies and saved passwords.
    "~/.mozilla",
    "~/.config/google-chrome",
    "~/.config/chromium",
    "~/.config/BraveSoftware",
    "~/.config/microsoft-edge",
    "~/Library/Application Support/Google/Chrome",
    "~/Library/Application Support/Firefox",
    "~/Library/Safari",
    "~/Library/Cookies",
)

# How much of a command line a message quotes: enough to recognise it, not a wall of text.
_QUOTE_LIMIT = 200
_MAX_ARG_TOKENS = 2000


@dataclass(frozen=True)
class Refusal:
    reason: Reason
    message: str


@dataclass(frozen=True)
class Decision:
    """What the policy says about one command, and which rule said it.

    ``rule`` is the rule's name as the policy file spells it (``allowed_roots``,
    ``denied_paths: ~/.ssh``, ``commands[2] "git push*"``, ``credentials.NAME.allow``,
    ``default_action``, ``policy.toml`` when the file itself is broken); ``message`` is one
    line for the control plane and the audit log that names the rule. Neither ever contains
    a secret value.
    """

    action: Action
    rule: str
    message: str
    # The Refused reason when action is "deny".
    reason: Reason = Reason.POLICY_DENIED

    @property
    def refusal(self) -> Refusal | None:
        """None only for ``allow``.

        ``deny`` gives the refusal to send. ``ask`` gives the refusal for a human's "no"
        (REASON_APPROVAL_DENIED), so code that does not handle ``ask`` fails closed; a
        daemon that holds the command uses :meth:`approval_refusal` once it knows the
        outcome.
        """
        if self.action == "allow":
            return None
        if self.action == "ask":
            return self.approval_refusal("denied")
        return Refusal(self.reason, self.message)

    def approval_refusal(self, outcome: Literal["denied", "timeout"]) -> Refusal:
        """The refusal for an ``ask`` that a human denied or nobody answered in time."""
        if outcome == "timeout":
            return Refusal(
                Reason.APPROVAL_TIMEOUT,
                f"nobody approved it on the device in time ({self.rule} asks for approval)",
            )
        return Refusal(
            Reason.APPROVAL_DENIED,
            f"denied by the user on the device ({self.rule} asks for approval)",
        )


@dataclass(frozen=True)
class Limits:
    max_runtime_seconds: int = 3600
    max_output_bytes: int = 64 * 1024 * 1024
    ask_timeout_seconds: int = 300


@dataclass(frozen=True)
class _MatchRule:
    """One table of a rule list: its action for what ``match`` matches."""

    TABLE: ClassVar[str]
    index: int  # 1-based position among the tables of its list
    action: Action
    match: str
    name: str | None = None

    @property
    def rule(self) -> str:
        """How audits, approvals and refusals name it: its name, or ``TABLE[index]``."""
        label = self.name or f"{self.TABLE}[{self.index}]"
        return f"{label} {json.dumps(self.match)}"


@dataclass(frozen=True)
class CommandRule(_MatchRule):
    """A ``[[commands]]`` table: what happens to commands whose argv matches ``match``."""

    TABLE: ClassVar[str] = "commands"


@dataclass(frozen=True)
class FileRule(_MatchRule):
    """A ``[[files]]`` table: what happens to file operations ``ops`` on paths matching
    ``match`` (a glob over the absolute path; ``*`` crosses ``/``)."""

    TABLE: ClassVar[str] = "files"
    ops: tuple[FileOp, ...] = FILE_OPS


@dataclass(frozen=True)
class CredentialScope:
    """``[credentials.NAME]``: which programs may receive it, and for which hosts it is used.

    ``allow``: globs over the command line whose first word names the program (resolved to
    its absolute path, see :func:`endpointd.guard.programs`). ``hosts``: the host names (or
    ``*.`` wildcards) the git helper answers for and the http delivery adds ``header`` to;
    required by those deliveries.
    """

    allow: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ()
    header: str = DEFAULT_HEADER


@dataclass(frozen=True)
class EnvRules:
    """``[env]``: variables of the daemon's own environment passed to commands (``pass``),
    and reserved names a command's ``exec.env`` may set all the same (``allow``)."""

    passed: tuple[str, ...] = ()
    allow: tuple[str, ...] = ()


@dataclass(frozen=True)
class WorkspaceRules:
    """``[workspaces]``: which repositories get a ticket workspace (globs over the
    normalised remote, ``host/owner/name``: ``deny`` beats ``ask`` beats ``allow``, else
    ``default_action``), how long a released one is kept, the disk all of them may take,
    and a setup command per repository (``[workspaces.setup]``, argv by remote)."""

    allow: tuple[str, ...] = ()
    ask: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    retention_hours: int = 72
    max_disk_mb: int = 20 * 1024
    setup: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def setup_for(self, repo: str) -> tuple[str, ...] | None:
        """The owner's setup command for the repository ``repo`` (normalised), if any."""
        return self.setup.get(repo.lower()) if repo else None


@dataclass(frozen=True)
class HarnessSettings:
    """``[harness.NAME]``: how this device runs one harness. Unset: the harness's own
    setting (its program on PATH, its model, its endpoint, its own login)."""

    program: Path | None = None
    model: str = ""
    base_url: str = ""
    # A stored credential delivered to this harness's runs (and only to them: it was named
    # for this harness here, so it needs no [credentials.NAME] scope), in credential_env.
    credential: str = ""
    credential_env: str = ""
    # How the key reaches the harness: "env" (its value in credential_env), or "http" (the
    # device's proxy adds it to the harness's HTTPS requests for the hosts of
    # [credentials.NAME]: the harness holds only a placeholder, never the key).
    delivery: str = "env"
    max_turns: int = 0  # the local cap on RunHarness.max_turns; 0: none


@dataclass(frozen=True)
class HarnessRules:
    """``[harness]``: the harness this device prefers (``default``) and the ones the control
    plane may run here (``allowed``; the default always is). Absent: none, since running
    the owner's CLI spends the owner's subscription or key."""

    default: str = ""
    allowed: tuple[str, ...] = ()
    settings: Mapping[str, HarnessSettings] = field(default_factory=dict)

    def allows(self, name: str) -> bool:
        return name in self.allowed or (bool(name) and name == self.default)

    def settings_for(self, name: str) -> HarnessSettings:
        return self.settings.get(name, HarnessSettings())


@dataclass(frozen=True)
class DeniedPath:
    label: str  # as shown in rule names: "~/.ssh", "endpointd config dir", or as written
    path: Path  # absolute, normalised
    default: bool


@dataclass(frozen=True)
class Rules:
    """The policy file's content, validated; paths expanded but not resolved."""

    allowed_roots: tuple[Path, ...] = ()
    denied_paths: tuple[DeniedPath, ...] = ()
    default_action: Action = "allow"
    commands: tuple[CommandRule, ...] = ()
    credentials: Mapping[str, CredentialScope] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)
    sandbox: SandboxMode = "required"
    network: NetworkMode = "allow"
    proxy_hosts: tuple[str, ...] = ()  # [proxy] allow_hosts: where network = "proxy" may go
    writable_paths: tuple[Path, ...] = ()  # beyond the workspace and the private TMPDIR
    env: EnvRules = field(default_factory=EnvRules)
    files: tuple[FileRule, ...] = ()
    workspaces: WorkspaceRules = field(default_factory=WorkspaceRules)
    harness: HarnessRules = field(default_factory=HarnessRules)
    # Where `endpointd creds add` puts new values; None: not set (the keyring).
    credential_store: Store | None = None


class PolicyError(ConfigError):
    """The policy file cannot be used; the message names the file, line and key."""

    def __init__(self, path: Path, message: str, line: int | None = None) -> None:
        self.path = path
        self.line = line
        where = f"{path}:{line}" if line else str(path)
        super().__init__(f"{where}: {message}")


# --------------------------------------------------------------------------- parsing

_TOP_KEYS = (
    "allowed_roots",
    "denied_paths",
    "writable_paths",
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
_RULE_KEYS = ("action", "match", "name")
_FILE_RULE_KEYS = ("action", "match", "ops", "name")
_SCOPE_KEYS = ("allow", "hosts", "header")
_PROXY_KEYS = ("allow_hosts",)
_ENV_KEYS = ("pass", "allow")
_HOST = re.compile(
    r"(\*\.)?[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*(:[0-9]{1,5})?\Z"
)
_VAR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_LIMIT_KEYS = ("max_runtime_seconds", "max_output_bytes", "ask_timeout_seconds")
_WORKSPACE_KEYS = ("allow", "ask", "deny", "retention_hours", "max_disk_mb", "setup")
_HARNESS_KEYS = ("default", "allowed", *NAMES)
_HARNESS_ENTRY_KEYS = (
    "program",
    "model",
    "base_url",
    "credential",
    "credential_env",
    "delivery",
    "max_turns",
)
HARNESS_DELIVERIES = ("env", "http")
# An endpoint for an OpenAI-compatible harness: http(s), a host, no spaces or quotes.
_BASE_URL = re.compile(r"https?://[^\s\"'\\]+\Z")
# A repository as the device reports it: host/owner/name (more segments for nested groups).
_REPOSITORY = re.compile(r"[a-z0-9._~\[\]:-]+(/[A-Za-z0-9._~-]+){2,}\Z")
_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(?:#.*)?$")


def _table_name(raw: str) -> str:
    return ".".join(part.strip().strip("\"'") for part in raw.split("."))


def _locate(text: str, table: str | None, key: str | None, nth: int = 1) -> int | None:
    """Best-effort line number of ``key`` in ``table`` (the nth array-of-tables entry)."""
    lines = text.splitlines()
    start, seen = 0, 0
    if table is not None:
        for i, line in enumerate(lines):
            m = _HEADER.match(line)
            if m and _table_name(m.group(2)) == table:
                seen += 1
                if seen == nth:
                    start = i + 1
                    break
        else:
            return None
        if key is None:
            return start
    if key is None:
        return None
    pattern = re.compile(rf"""^\s*["']?{re.escape(key)}["']?\s*=""")
    for i in range(start, len(lines)):
        if _HEADER.match(lines[i]):
            if table is not None:
                return None
            continue
        if pattern.match(lines[i]):
            return i + 1
    return None


class _Parser:
    def __init__(self, path: Path, text: str, home: Path) -> None:
        self.path = path
        self.text = text
        self.home = home

    def fail(
        self, message: str, table: str | None = None, key: str | None = None, nth: int = 1
    ) -> PolicyError:
        return PolicyError(self.path, message, _locate(self.text, table, key, nth))

    def unknown(
        self, data: Mapping[str, Any], known: Sequence[str], table: str | None, nth: int = 1
    ) -> None:
        for key in data:
            if key not in known:
                where = f" in [{table}]" if table else ""
                raise self.fail(
                    f"unknown key {key!r}{where}; known keys: {', '.join(known)}",
                    table,
                    key,
                    nth,
                )

    def path_list(self, data: Mapping[str, Any], key: str) -> tuple[tuple[str, Path], ...]:
        value = data.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(f"{key} must be a list of paths (strings)", None, key)
        out = []
        for raw in value:
            if not raw.strip():
                raise self.fail(f"{key} contains an empty path", None, key)
            expanded = expand_path(raw, self.home)
            if not expanded.is_absolute():
                raise self.fail(
                    f"{key}: {raw!r} is not an absolute path (write /… or ~/…)", None, key
                )
            out.append((raw, expanded))
        return tuple(out)

    def parse(self) -> Rules:
        try:
            data = tomllib.loads(self.text)
        except tomllib.TOMLDecodeError as exc:
            m = re.search(r"at line (\d+)", str(exc))
            # "at end of document": the error is on the last line (e.g. an unclosed array).
            line = int(m.group(1)) if m else max(1, len(self.text.splitlines()))
            raise PolicyError(self.path, f"not valid TOML: {exc}", line) from None
        self.unknown(data, _TOP_KEYS, None)

        roots = tuple(p for _, p in self.path_list(data, "allowed_roots"))
        denied = tuple(
            DeniedPath(label=raw, path=p, default=False)
            for raw, p in self.path_list(data, "denied_paths")
        )

        writable = tuple(p for _, p in self.path_list(data, "writable_paths"))
        default_action = self.choice(data, "default_action", ACTIONS, "allow")
        sandbox = self.choice(data, "sandbox", SANDBOX_MODES, "required")
        network = self.choice(data, "network", NETWORK_MODES, "allow")
        proxy_raw = self.table(data, "proxy", _PROXY_KEYS)
        proxy_hosts = self.hosts(proxy_raw, "allow_hosts", "proxy")
        env_raw = self.table(data, "env", _ENV_KEYS)
        env = EnvRules(passed=self.names(env_raw, "pass"), allow=self.names(env_raw, "allow"))
        files = self.file_rules(data)
        workspaces = self.workspace_rules(data)
        harness = self.harness_rules(data)

        commands_raw = data.get("commands", [])
        if not isinstance(commands_raw, list) or not all(isinstance(c, dict) for c in commands_raw):
            raise self.fail("commands must be [[commands]] tables", None, "commands")
        commands: list[CommandRule] = []
        names: set[str] = set()
        for i, rule in enumerate(commands_raw, start=1):
            table = "commands"
            self.unknown(rule, _RULE_KEYS, table, i)
            action = rule.get("action")
            if action not in ACTIONS:
                raise self.fail(
                    f"commands[{i}].action must be one of {', '.join(map(repr, ACTIONS))},"
                    f" got {action!r}",
                    table,
                    "action" if "action" in rule else None,
                    i,
                )
            match = rule.get("match")
            if not isinstance(match, str) or not match.strip():
                raise self.fail(
                    f"commands[{i}].match must be a non-empty glob over the command line,"
                    ' e.g. "git push *"',
                    table,
                    "match" if "match" in rule else None,
                    i,
                )
            name = rule.get("name")
            if name is not None:
                if not isinstance(name, str) or not name.strip() or any(c.isspace() for c in name):
                    raise self.fail(
                        f"commands[{i}].name must be a non-empty word", table, "name", i
                    )
                if name in names:
                    raise self.fail(f"two command rules are named {name!r}", table, "name", i)
                names.add(name)
            commands.append(
                CommandRule(index=i, action=cast(Action, action), match=match, name=name)
            )

        creds_raw = data.get("credentials", {})
        if not isinstance(creds_raw, dict):
            raise self.fail("credentials must be [credentials.NAME] tables", None, "credentials")
        scopes: dict[str, CredentialScope] = {}
        for cred, scope in creds_raw.items():
            table = f"credentials.{cred}"
            if not valid_name(cred):
                raise self.fail(
                    f"invalid credential name {cred!r} in [{table}]: use {NAME_RULE}", table, None
                )
            if not isinstance(scope, dict):
                raise self.fail(f"[{table}] must be a table with `allow = [...]`", table, None)
            self.unknown(scope, _SCOPE_KEYS, table)
            allow = scope.get("allow")
            if not isinstance(allow, list) or not all(
                isinstance(g, str) and g.strip() for g in allow
            ):
                raise self.fail(
                    f'{table}.allow must be a list of command globs, e.g. ["git *"]',
                    table,
                    "allow" if "allow" in scope else None,
                )
            header = scope.get("header", DEFAULT_HEADER)
            if (
                not isinstance(header, str)
                or header.count("{secret}") != 1
                or not re.match(r"[A-Za-z0-9-]+: ", header)
                or any(c in header for c in "\r\n\0")
            ):
                raise self.fail(
                    f"{table}.header must be one header line holding {{secret}} once,"
                    f" e.g. {json.dumps(DEFAULT_HEADER)}",
                    table,
                    "header",
                )
            scopes[cred] = CredentialScope(
                allow=tuple(allow), hosts=self.hosts(scope, "hosts", table), header=header
            )

        limits_raw = data.get("limits", {})
        if not isinstance(limits_raw, dict):
            raise self.fail("limits must be a [limits] table", None, "limits")
        self.unknown(limits_raw, _LIMIT_KEYS, "limits")
        values: dict[str, int] = {}
        for key in _LIMIT_KEYS:
            if key in limits_raw:
                value = limits_raw[key]
                if type(value) is not int or value <= 0:
                    raise self.fail(
                        f"limits.{key} must be a positive integer, got {value!r}", "limits", key
                    )
                values[key] = value

        credential_store = (
            self.choice(data, "credential_store", STORES, "keyring")
            if "credential_store" in data
            else None
        )

        for name, settings in harness.settings.items():
            # The proxy adds the key only for the credential's own hosts: without them it
            # would go nowhere, and the run would fail later with a less useful error.
            if settings.delivery == "http" and not (
                settings.credential in scopes and scopes[settings.credential].hosts
            ):
                raise self.fail(
                    f'harness.{name}.delivery = "http" needs [credentials.{settings.credential}]'
                    f' with hosts = ["…"] (the hosts of the harness\'s endpoint, where the'
                    " device's proxy adds the key) and allow = [] (no other program gets it)",
                    f"harness.{name}",
                    "delivery",
                )

        return Rules(
            allowed_roots=roots,
            denied_paths=denied,
            default_action=cast(Action, default_action),
            commands=tuple(commands),
            credentials=scopes,
            limits=Limits(**values),
            sandbox=cast(SandboxMode, sandbox),
            network=cast(NetworkMode, network),
            proxy_hosts=proxy_hosts,
            writable_paths=writable,
            env=env,
            files=files,
            workspaces=workspaces,
            harness=harness,
            credential_store=cast(Store | None, credential_store),
        )

    def choice(
        self, data: Mapping[str, Any], key: str, choices: Sequence[str], default: str
    ) -> str:
        value = data.get(key, default)
        if value not in choices:
            raise self.fail(
                f"{key} must be one of {', '.join(map(repr, choices))}, got {value!r}", None, key
            )
        return str(value)

    def table(self, data: Mapping[str, Any], key: str, known: Sequence[str]) -> Mapping[str, Any]:
        value = data.get(key, {})
        if not isinstance(value, dict):
            raise self.fail(f"{key} must be a [{key}] table", None, key)
        self.unknown(value, known, key)
        return value

    def hosts(self, data: Mapping[str, Any], key: str, table: str) -> tuple[str, ...]:
        value = data.get(key, [])
        if not isinstance(value, list) or not all(isinstance(h, str) for h in value):
            raise self.fail(f"{table}.{key} must be a list of host names", table, key)
        for host in value:
            if not _HOST.match(host):
                raise self.fail(
                    f"{table}.{key}: {host!r} is not a host name (write github.com,"
                    " *.example.com or host:port; no scheme, no path)",
                    table,
                    key,
                )
        return tuple(h.lower() for h in value)

    def names(self, data: Mapping[str, Any], key: str) -> tuple[str, ...]:
        value = data.get(key, [])
        if not isinstance(value, list) or not all(
            isinstance(v, str) and _VAR.match(v) for v in value
        ):
            raise self.fail(f"env.{key} must be a list of variable names", "env", key)
        return tuple(value)

    def workspace_rules(self, data: Mapping[str, Any]) -> WorkspaceRules:
        raw = self.table(data, "workspaces", _WORKSPACE_KEYS)
        globs: dict[str, tuple[str, ...]] = {}
        for key in ("allow", "ask", "deny"):
            value = raw.get(key, [])
            if not isinstance(value, list) or not all(
                isinstance(g, str) and g.strip() and not any(c.isspace() for c in g) for g in value
            ):
                raise self.fail(
                    f"workspaces.{key} must be a list of repository globs, e.g."
                    ' ["github.com/acme/*"]',
                    "workspaces",
                    key,
                )
            globs[key] = tuple(g.lower() for g in value)
        retention = raw.get("retention_hours", WorkspaceRules.retention_hours)
        if type(retention) is not int or retention < 0:
            raise self.fail(
                "workspaces.retention_hours must be a whole number of hours, 0 or more (0:"
                f" remove a released workspace at once), got {retention!r}",
                "workspaces",
                "retention_hours",
            )
        budget = raw.get("max_disk_mb", WorkspaceRules.max_disk_mb)
        if type(budget) is not int or budget <= 0:
            raise self.fail(
                f"workspaces.max_disk_mb must be a positive integer, got {budget!r}",
                "workspaces",
                "max_disk_mb",
            )
        setup_raw = raw.get("setup", {})
        if not isinstance(setup_raw, dict):
            raise self.fail(
                "workspaces.setup must be a [workspaces.setup] table of repository ="
                ' command, e.g. "github.com/acme/app" = ["make", "bootstrap"]',
                "workspaces",
                "setup",
            )
        setup: dict[str, tuple[str, ...]] = {}
        for repo, command in setup_raw.items():
            if not _REPOSITORY.match(repo.lower()):
                raise self.fail(
                    f"[workspaces.setup]: {repo!r} is not a repository as devices report it"
                    ' (host/owner/name, e.g. "github.com/acme/app")',
                    "workspaces.setup",
                    None,
                )
            if isinstance(command, str) and command.strip():
                argv: tuple[str, ...] = ("sh", "-c", command)
            elif (
                isinstance(command, list)
                and command
                and all(isinstance(a, str) for a in command)
                and command[0]
            ):
                argv = tuple(command)
            else:
                raise self.fail(
                    f"[workspaces.setup] {json.dumps(repo)} must be a command line (run by"
                    ' sh) or a list of arguments, e.g. ["make", "bootstrap"]',
                    "workspaces.setup",
                    repo,
                )
            setup[repo.lower()] = argv
        return WorkspaceRules(
            allow=globs["allow"],
            ask=globs["ask"],
            deny=globs["deny"],
            retention_hours=retention,
            max_disk_mb=budget,
            setup=setup,
        )

    def harness_rules(self, data: Mapping[str, Any]) -> HarnessRules:
        raw = data.get("harness", {})
        if not isinstance(raw, dict):
            raise self.fail("harness must be a [harness] table", None, "harness")
        known = ", ".join(NAMES)
        for key, value in raw.items():
            if key in _HARNESS_KEYS:
                continue
            if isinstance(value, dict):
                raise self.fail(
                    f"unknown harness {key!r} in [harness.{key}]; endpointd knows {known}",
                    f"harness.{key}",
                    None,
                )
            raise self.fail(
                f"unknown key {key!r} in [harness]; known keys: default, allowed, and a"
                f" [harness.NAME] table per harness ({known})",
                "harness",
                key,
            )
        default = raw.get("default", "")
        if not isinstance(default, str) or (default and default not in NAMES):
            raise self.fail(
                f"harness.default must be one of {', '.join(map(repr, NAMES))}, got {default!r}",
                "harness",
                "default",
            )
        allowed = raw.get("allowed", [])
        if not isinstance(allowed, list) or not all(
            isinstance(a, str) and a in NAMES for a in allowed
        ):
            raise self.fail(
                f'harness.allowed must be a list of harness names ({known}), e.g. ["qwen"]',
                "harness",
                "allowed",
            )
        settings = {name: self.harness_settings(name, raw[name]) for name in NAMES if name in raw}
        return HarnessRules(default=default, allowed=tuple(allowed), settings=settings)

    def harness_settings(self, name: str, raw: object) -> HarnessSettings:
        table = f"harness.{name}"
        if not isinstance(raw, dict):
            raise self.fail(f"[{table}] must be a table", "harness", name)
        self.unknown(raw, _HARNESS_ENTRY_KEYS, table)

        def text(key: str, what: str, spaces: bool = False) -> str:
            value = raw.get(key, "")
            if (
                not isinstance(value, str)
                or (key in raw and not value.strip())
                or value.startswith("-")
                or "\0" in value
                or (not spaces and any(c.isspace() for c in value))
            ):
                raise self.fail(f"{table}.{key} must be {what}", table, key)
            return value

        program: Path | None = None
        if "program" in raw:
            written = text("program", "the absolute path of its executable", spaces=True)
            program = expand_path(written, self.home)
            if not program.is_absolute():
                raise self.fail(
                    f"{table}.program: {written!r} is not an absolute path (write /… or ~/…)",
                    table,
                    "program",
                )
        model = text("model", 'a model name, e.g. "qwen3-coder-plus"')
        base_url = text("base_url", 'an http(s) URL, e.g. "https://api.example.com/v1"')
        if base_url and not HARNESSES[name].base_url:
            raise self.fail(
                f"{table}.base_url: {HARNESSES[name].title} has no OpenAI-compatible endpoint"
                " to set; remove the key",
                table,
                "base_url",
            )
        if base_url and not _BASE_URL.match(base_url):
            raise self.fail(
                f'{table}.base_url must be an http(s) URL, e.g. "https://api.example.com/v1",'
                f" got {base_url!r}",
                table,
                "base_url",
            )
        credential = text("credential", "the name of a stored credential")
        if credential and not valid_name(credential):
            raise self.fail(
                f"{table}.credential: invalid credential name {credential!r}: use {NAME_RULE}",
                table,
                "credential",
            )
        env_var = raw.get("credential_env", "")
        if not isinstance(env_var, str) or (
            "credential_env" in raw and (not _VAR.match(env_var) or environment.reserved(env_var))
        ):
            raise self.fail(
                f"{table}.credential_env must be a variable name that does not steer how"
                f" programs start (default {HARNESSES[name].credential_env})",
                table,
                "credential_env",
            )
        if env_var and not credential:
            raise self.fail(
                f"{table}.credential_env needs {table}.credential (the credential it delivers)",
                table,
                "credential_env",
            )
        delivery = raw.get("delivery", "env")
        if delivery not in HARNESS_DELIVERIES:
            raise self.fail(
                f'{table}.delivery must be "env" or "http", got {delivery!r}', table, "delivery"
            )
        if delivery == "http" and not credential:
            raise self.fail(
                f"{table}.delivery needs {table}.credential (the credential it delivers)",
                table,
                "delivery",
            )
        max_turns = raw.get("max_turns", 0)
        if type(max_turns) is not int or ("max_turns" in raw and max_turns <= 0):
            raise self.fail(
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

    def file_rules(self, data: Mapping[str, Any]) -> tuple[FileRule, ...]:
        raw = data.get("files", [])
        if not isinstance(raw, list) or not all(isinstance(r, dict) for r in raw):
            raise self.fail("files must be [[files]] tables", None, "files")
        rules: list[FileRule] = []
        for i, rule in enumerate(raw, start=1):
            self.unknown(rule, _FILE_RULE_KEYS, "files", i)
            action = rule.get("action")
            if action not in ACTIONS:
                raise self.fail(
                    f"files[{i}].action must be one of {', '.join(map(repr, ACTIONS))},"
                    f" got {action!r}",
                    "files",
                    "action" if "action" in rule else None,
                    i,
                )
            match = rule.get("match")
            if not isinstance(match, str) or not match.strip():
                raise self.fail(
                    f"files[{i}].match must be a non-empty glob over the absolute path,"
                    ' e.g. "*/.github/workflows/*"',
                    "files",
                    "match" if "match" in rule else None,
                    i,
                )
            if not (match.startswith(("/", "~/", "*"))):
                raise self.fail(
                    f"files[{i}].match must start with /, ~/ or * (it is matched against"
                    " absolute paths)",
                    "files",
                    "match",
                    i,
                )
            if match.startswith("~/"):
                match = str(self.home) + match[1:]
            ops = rule.get("ops", list(FILE_OPS))
            if (
                not isinstance(ops, list)
                or not ops
                or not all(isinstance(o, str) and o in FILE_OPS for o in ops)
            ):
                raise self.fail(
                    f"files[{i}].ops must list some of {', '.join(map(repr, FILE_OPS))}",
                    "files",
                    "ops",
                    i,
                )
            name = rule.get("name")
            if name is not None and (
                not isinstance(name, str) or not name.strip() or any(c.isspace() for c in name)
            ):
                raise self.fail(f"files[{i}].name must be a non-empty word", "files", "name", i)
            rules.append(
                FileRule(
                    index=i,
                    action=cast(Action, action),
                    match=match,
                    ops=tuple(cast(FileOp, o) for o in ops),
                    name=name,
                )
            )
        return tuple(rules)


def expand_path(raw: str, home: Path | None = None) -> Path:
    """``~`` and ``~/…`` expanded against ``home``; normalised (``..`` folded) if absolute."""
    home = Path.home() if home is None else home
    if raw == "~":
        text = str(home)
    elif raw.startswith("~/"):
        text = str(home) + raw[1:]
    else:
        text = os.path.expanduser(raw)
    return Path(os.path.normpath(text)) if os.path.isabs(text) else Path(text)


def parse_policy(text: str, path: Path, home: Path | None = None) -> Rules:
    """Validate a policy file's text; PolicyError naming the key and line."""
    return _Parser(path, text, Path.home() if home is None else home).parse()


# --------------------------------------------------------------------------- evaluation


def _quote(argv: Sequence[str]) -> str:
    line = " ".join(argv)
    return json.dumps(line if len(line) <= _QUOTE_LIMIT else line[:_QUOTE_LIMIT] + "…")


def command_lines(argv: Sequence[str]) -> tuple[str, ...]:
    """What command globs are matched against: the argv joined by spaces, and the same with
    argv[0] reduced to its base name (so ``rm *`` also catches ``/bin/rm -rf x``)."""
    line = " ".join(argv)
    base = os.path.basename(argv[0]) if argv else ""
    if argv and base and base != argv[0]:
        return (line, " ".join([base, *argv[1:]]))
    return (line,)


def glob_matches(glob: str, argv: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(line, glob) for line in command_lines(argv))


_TOKEN_SPLIT = re.compile(r"""[\s'"=;|&<>()`,]+""")


@dataclass(frozen=True)
class _Root:
    written: Path
    real: str


@dataclass(frozen=True)
class _Denied:
    entry: DeniedPath
    forms: tuple[str, ...]  # normalised and resolved


@dataclass
class _Loaded:
    rules: Rules | None
    error: str | None
    digest: bytes
    roots: tuple[_Root, ...] = ()
    denied: tuple[_Denied, ...] = ()


_UNSET = object()


class Policy:
    """The rules of ``path`` (normally ``<config dir>/policy.toml``), kept current.

    ``state_dir`` and ``home`` default to the daemon's state dir and the user's home; they
    only matter for the built-in denied paths (endpointd's own files, ``~/.ssh``, …).
    ``data_dir`` (default: the daemon's) holds the tickets' workspaces, which are allowed
    like an allowed root each (:meth:`workspace_for`).
    """

    def __init__(
        self,
        path: Path,
        *,
        state_dir: Path | None = None,
        home: Path | None = None,
        data_dir: Path | None = None,
    ) -> None:
        self.path = path
        self.config_dir = path.parent
        self._state_dir = state_dir
        self._data_dir = data_dir
        self._home = home
        self._stamp: object = _UNSET
        self._loaded = _Loaded(rules=None, error="not loaded", digest=b"")
        self._refresh()

    # ------------------------------------------------------------------ loading

    @property
    def home(self) -> Path:
        return Path.home() if self._home is None else self._home

    def _refresh(self) -> _Loaded:
        st: os.stat_result | None = None
        try:
            st = os.stat(self.path)
            stamp: object = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        except FileNotFoundError:
            stamp = None
        except OSError as exc:
            stamp = ("error", exc.errno)
        if stamp == self._stamp:
            return self._loaded
        self._loaded = self._load(st)
        self._stamp = stamp
        return self._loaded

    def _load(self, st: os.stat_result | None) -> _Loaded:
        denied_defaults = self._default_denied()
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return self._broken(
                f"{self.path}: no policy file; create it with `endpointd policy init"
                " --allow-root DIR` (pairing does this)",
                b"",
                denied_defaults,
            )
        except OSError as exc:
            return self._broken(f"{self.path}: cannot read: {exc.strerror}", b"", denied_defaults)
        if st is not None and os.name == "posix" and st.st_mode & 0o022:
            return self._broken(
                f"{self.path}: the policy file is writable by other users (mode"
                f" {st.st_mode & 0o777:o}), so it cannot be trusted; run `chmod 600"
                f" {self.path}`",
                data,
                denied_defaults,
            )
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return self._broken(f"{self.path}: not UTF-8 text", data, denied_defaults)
        try:
            rules = parse_policy(text, self.path, self.home)
        except PolicyError as exc:
            return self._broken(str(exc), data, denied_defaults)
        roots = tuple(_Root(written=p, real=os.path.realpath(p)) for p in rules.allowed_roots)
        return _Loaded(
            rules=rules,
            error=None,
            digest=hashlib.sha256(data).digest(),
            roots=roots,
            denied=self._denied((*denied_defaults, *rules.denied_paths)),
        )

    def _broken(self, error: str, data: bytes, denied: Iterable[DeniedPath]) -> _Loaded:
        return _Loaded(
            rules=None,
            error=error,
            digest=hashlib.sha256(data).digest(),
            denied=self._denied(denied),
        )

    def _default_denied(self) -> tuple[DeniedPath, ...]:
        home = self.home
        out = [
            DeniedPath(label=p, path=expand_path(p, home), default=True)
            for p in DEFAULT_DENIED_PATHS
        ]
        xdg_data = os.environ.get("XDG_DATA_HOME")
        if xdg_data and os.path.isabs(xdg_data):
            for sub in ("keyrings", "python_keyring"):
                out.append(
                    DeniedPath(
                        label=f"$XDG_DATA_HOME/{sub}",
                        path=Path(os.path.normpath(xdg_data)) / sub,
                        default=True,
                    )
                )
        config = Path(os.path.abspath(self.config_dir))
        # Inside the config dir, but named on its own: it holds credential values in plain
        # files (the file store), and a refusal should say that is what was reached for.
        out.append(
            DeniedPath(
                label="endpointd credential files",
                path=config / CREDENTIAL_FILES_DIR,
                default=True,
            )
        )
        out.append(DeniedPath(label="endpointd config dir", path=config, default=True))
        state = self._state_dir if self._state_dir is not None else state_dir().path
        out.append(
            DeniedPath(label="endpointd state dir", path=Path(os.path.abspath(state)), default=True)
        )
        key_file = _key_file(config)
        if key_file is not None:
            out.append(DeniedPath(label="endpointd key file", path=key_file, default=True))
        return tuple(out)

    @staticmethod
    def _denied(entries: Iterable[DeniedPath]) -> tuple[_Denied, ...]:
        out = []
        for entry in entries:
            forms = {str(entry.path), os.path.realpath(entry.path)}
            out.append(_Denied(entry=entry, forms=tuple(sorted(forms))))
        return tuple(out)

    # ------------------------------------------------------------------ views

    @property
    def error(self) -> str | None:
        """Why the policy cannot be used (every command is then refused), or None."""
        return self._refresh().error

    @property
    def rules(self) -> Rules | None:
        return self._refresh().rules

    @property
    def limits(self) -> Limits:
        rules = self._refresh().rules
        return rules.limits if rules is not None else Limits()

    @property
    def allowed_roots(self) -> list[Path]:
        """The allowed roots, resolved (symlinks and ``..``), in file order."""
        return [Path(r.real) for r in self._refresh().roots]

    @property
    def default_root(self) -> Path:
        """Where a command that names no cwd runs: the first allowed root (home if none)."""
        roots = self._refresh().roots
        return Path(roots[0].real) if roots else self.home

    @property
    def workspaces_root(self) -> Path:
        """Where the tickets' workspaces are: ``<data dir>/workspaces``."""
        base = self._data_dir if self._data_dir is not None else data_dir().path
        return Path(os.path.abspath(base)) / "workspaces"

    @property
    def workspace_rules(self) -> WorkspaceRules:
        rules = self._refresh().rules
        return rules.workspaces if rules is not None else WorkspaceRules()

    def ticket_workspace(self, path: str) -> Path | None:
        """The ticket workspace (``<data dir>/workspaces/<ticket>``) holding ``path``
        (resolved), or None: the root itself is nobody's."""
        real = os.path.realpath(path)
        root = os.path.realpath(self.workspaces_root)
        if real == root or not _within(real, root):
            return None
        name = os.path.relpath(real, root).split(os.sep)[0]
        return Path(root) / name

    def operation_roots(self, path: str) -> list[str]:
        """The roots a file operation on ``path`` is confined to: the ticket workspace
        holding it first (so it cannot wander into another ticket's), then the allowed
        roots."""
        workspace = self.ticket_workspace(path)
        roots = [str(r) for r in self.allowed_roots]
        return [str(workspace), *roots] if workspace is not None else roots

    def workspace_for(self, cwd: str) -> Path | None:
        """Where a command in ``cwd`` (resolved) may write: the ticket workspace holding
        it, else the allowed root holding it."""
        real = os.path.realpath(cwd)
        ticket = self.ticket_workspace(real)
        if ticket is not None:
            return ticket
        for root in self._refresh().roots:
            if _within(real, root.real):
                return Path(root.real)
        return None

    @property
    def sandbox_summary(self) -> str:
        """How commands are confined under this policy, in one line (status, Hello)."""
        rules = self._refresh().rules
        if rules is None:
            return "none: the policy cannot be used, so every command is refused"
        return sandbox.describe(rules.sandbox, rules.network)

    @property
    def denied_paths(self) -> list[DeniedPath]:
        """Built-in denied paths first, then the file's."""
        return [d.entry for d in self._refresh().denied]

    def hash(self) -> bytes:
        """SHA-256 of the policy being enforced and of how this machine enforces it.

        Over the policy file's bytes (b"" when there is none), then ``b"\\n\\0effective: "``
        and the effective mode line of :meth:`_effective_mode`, so that the same file on a
        machine that cannot enforce its sandbox hashes differently. Deterministic: the same
        file on equally capable machines gives the same hash. The bytes are the ones the
        rules in force were parsed from: if the file changed since, it is loaded again.
        """
        data = b""
        for _ in range(3):
            loaded = self._refresh()
            try:
                data = self.path.read_bytes()
            except OSError:
                data = b""  # as the loader: missing or unreadable is the hash of b""
            if hashlib.sha256(data).digest() == loaded.digest:
                break
            self._stamp = _UNSET  # changed under us (or within the stamp's resolution)
        digest = hashlib.sha256(data)
        digest.update(b"\n\0effective: ")
        digest.update(self._effective_mode(loaded.rules).encode())
        return digest.digest()

    @staticmethod
    def _effective_mode(rules: Rules | None) -> str:
        """``sandbox=<mode>; network=<mode>; enforced=<yes|partly|no>`` for :meth:`hash`.

        ``enforced``: ``yes`` when this machine enforces all of the confinement, ``partly``
        when its sandbox lacks something (under ``required`` such commands are refused),
        ``no`` when commands would run unconfined (``off``, or no OS sandbox at all). A
        policy that cannot be used (every command refused) is ``sandbox=none``.
        """
        if rules is None:
            return "sandbox=none; network=none; enforced=no"
        if rules.sandbox == "off":
            enforced = "no"
        else:
            here = sandbox.support()
            if not here.missing(rules.network):
                enforced = "yes"
            else:
                enforced = "partly" if here.mechanism else "no"
        return f"sandbox={rules.sandbox}; network={rules.network}; enforced={enforced}"

    # ------------------------------------------------------------------ checks

    def check(self, command: Command) -> Decision:
        """Judge ``command`` (already structurally validated)."""
        op = command.op
        kind = command.kind
        if kind == "cancel":
            return Decision("allow", "cancel", "cancelling a command is always allowed")
        if isinstance(op, ReleaseWorkspace):
            return Decision(
                "allow",
                "release_workspace",
                "releasing a ticket's workspace only lets endpointd remove what it made",
            )
        loaded = self._refresh()
        if loaded.rules is None:
            return self._broken_decision(loaded)
        if isinstance(op, Exec):
            names = [c.name for c in command.credentials]
            if isinstance(op, HarnessExec) and op.credential:
                # The harness's own key, named for it in [harness.NAME] credential and
                # attached by this device (never by the control plane): scoped to its runs
                # by that, so it needs no [credentials.NAME] allow entry.
                names = [n for n in names if n != op.credential]
            return self._exec(loaded, list(op.argv), op.cwd, names, None, env=dict(op.env))
        if isinstance(op, RunHarness):
            return Decision(
                "deny",
                "harness",
                "a run_harness is judged once this device has built its command"
                " (endpointd.harness.runs); this one was not",
            )
        if isinstance(op, ReadFile | WriteFile | ListDir):
            return self._file_decision(loaded, op.path, self._file_op(op.KIND), None)
        # A search reads the files beneath its path; a glob lists them.
        if isinstance(op, Search):
            return self._file_decision(loaded, op.path, "read", None)
        if isinstance(op, Glob):
            return self._file_decision(loaded, op.path, "list", None)
        if isinstance(op, PrepareWorkspace):
            if command.credentials:
                return Decision(
                    "deny",
                    "credentials",
                    "prepare_workspace takes no credentials: endpointd fetches with your own"
                    " git setup (credential helper, ssh agent)",
                    Reason.CREDENTIAL_UNAVAILABLE,
                )
            return self._workspace_decision(loaded, op.path, op.repo)
        return Decision("deny", "policy", f"the policy does not know command kind {kind!r}")

    def check_workspace(self, path: str, repo: str) -> Decision:
        """Judge a workspace of the clone (or directory) ``path`` of repository ``repo``:
        allowed roots and denied paths, then ``[workspaces]`` deny, ask, allow (globs over
        the repository), then ``default_action``."""
        loaded = self._refresh()
        if loaded.rules is None:
            return self._broken_decision(loaded)
        return self._workspace_decision(loaded, path, repo)

    def _workspace_decision(self, loaded: _Loaded, path: str, repo: str) -> Decision:
        assert loaded.rules is not None
        if path:
            refused = self._path(loaded, path, "prepare_workspace path", None)
            if refused is not None:
                return refused
            if self.ticket_workspace(path) is not None:
                return Decision(
                    "deny",
                    "workspaces",
                    f"prepare_workspace path {path} is a ticket's workspace, not a clone",
                )
            repo = repo or remote_of(os.path.realpath(path))
        elif not loaded.roots:
            return Decision(
                "deny",
                "allowed_roots",
                f"no allowed roots are configured: add a directory to allowed_roots in {self.path}",
            )
        rules = loaded.rules.workspaces
        name = repo.lower()
        what = f"a workspace of {repo}" if repo else f"a workspace of {path}"
        for action, globs in (("deny", rules.deny), ("ask", rules.ask), ("allow", rules.allow)):
            for glob in globs:
                if name and fnmatch.fnmatchcase(name, glob):
                    rule = f"workspaces.{action} {json.dumps(glob)}"
                    return self._workspace_rule_decision(cast(Action, action), rule, what)
        return self._workspace_rule_decision(loaded.rules.default_action, "default_action", what)

    def _workspace_rule_decision(self, action: Action, rule: str, what: str) -> Decision:
        if action == "deny":
            return Decision("deny", rule, f"{what} is denied by {rule} in {self.path}")
        if action == "ask":
            return Decision(
                "ask", rule, f"{what} needs approval on the device ({rule}): `endpointd approvals`"
            )
        return Decision("allow", rule, f"{what} is allowed by {rule}")

    def check_path(self, path: str, op: FileOp = "read") -> Decision:
        """Judge the file operation ``op`` on ``path`` as :meth:`check` judges a
        read_file, write_file or list_dir: allowed roots and denied paths first (deny
        wins), then the first ``[[files]]`` rule for ``op`` whose match fits the path (as
        written, normalised, or resolved), then, for writes, the built-in protected paths
        (``protected: …``, denied), then ``default_action``."""
        loaded = self._refresh()
        if loaded.rules is None:
            return self._broken_decision(loaded)
        return self._file_decision(loaded, path, op, None)

    def explain(
        self,
        argv: list[str],
        cwd: str | None,
        credentials: list[str],
        env: Mapping[str, str] | None = None,
    ) -> str:
        """Why ``argv`` (in ``cwd``, with ``credentials``) gets its decision, step by step."""
        loaded = self._refresh()
        steps = [f"policy: {self.path} (policy hash {self.hash().hex()[:16]}…)"]
        if loaded.rules is None:
            decision = self._broken_decision(loaded)
        else:
            decision = self._exec(loaded, argv, cwd or "", credentials, steps, env=env or {})
        steps.append(f"decision: {decision.action} ({decision.rule})\n  {decision.message}")
        return "\n".join(steps)

    def explain_path(self, path: str, op: FileOp = "read") -> str:
        """Why the file operation ``op`` on ``path`` gets its decision, step by step."""
        loaded = self._refresh()
        steps = [f"policy: {self.path} (policy hash {self.hash().hex()[:16]}…)"]
        if loaded.rules is None:
            decision = self._broken_decision(loaded)
        else:
            decision = self._file_decision(loaded, path, op, steps)
        steps.append(f"decision: {decision.action} ({decision.rule})\n  {decision.message}")
        return "\n".join(steps)

    def denied_rule(self, path: str) -> str | None:
        """``denied_paths: …`` when ``path`` (as written or resolved) is inside a denied
        path, else None: what a file operation may never open, list or walk through."""
        hit = self._denied_hit(self._refresh(), path)
        return None if hit is None else f"denied_paths: {hit.entry.label}"

    # ------------------------------------------------------------------ internals

    def _broken_decision(self, loaded: _Loaded) -> Decision:
        return Decision(
            "deny",
            POLICY_FILE,
            f"the local policy cannot be used, so every command is refused: {loaded.error}",
        )

    def _denied_hit(self, loaded: _Loaded, path: str) -> _Denied | None:
        forms = {os.path.normpath(path), os.path.realpath(path)}
        for denied in loaded.denied:
            for form in forms:
                if any(_within(form, d) for d in denied.forms):
                    return denied
        return None

    def _path(
        self,
        loaded: _Loaded,
        path: str,
        what: str,
        steps: list[str] | None,
        *,
        real: str | None = None,
    ) -> Decision | None:
        """A deny decision when ``path`` is denied or outside every root, else None.
        ``real``: ``path`` resolved, when the caller has it already."""
        if real is None:
            real = os.path.realpath(path)
        hit = self._denied_in(loaded, (os.path.normpath(path), real))
        if hit is not None:
            rule = f"denied_paths: {hit.entry.label}"
            return Decision(
                "deny", rule, f"{what} {path} is inside a denied path ({rule} in {self.path})"
            )
        workspace = self.ticket_workspace(real)
        if workspace is not None:
            if steps is not None:
                steps.append(f"{what} {path}: inside the ticket workspace {workspace}")
            return None
        if not loaded.roots:
            return Decision(
                "deny",
                "allowed_roots",
                f"no allowed roots are configured: add a directory to allowed_roots in {self.path}",
            )
        for root in loaded.roots:
            if _within(real, root.real):
                if steps is not None:
                    steps.append(
                        f"{what} {path}: inside allowed root {root.written} (allowed_roots)"
                    )
                return None
        resolved = f" (it resolves to {real})" if real != os.path.normpath(path) else ""
        roots = ", ".join(str(r.written) for r in loaded.roots)
        return Decision(
            "deny",
            "allowed_roots",
            f"{what} {path}{resolved} is outside the allowed roots ({roots}; allowed_roots in"
            f" {self.path})",
        )

    def _argv_paths(self, argv: Sequence[str], cwd: str) -> Iterable[tuple[str, str]]:
        """(argument, path) for every argv word that names a path, best effort."""
        home = str(self.home)
        count = 0
        for arg in argv:
            for word in _TOKEN_SPLIT.split(arg):
                if not word:
                    continue
                count += 1
                if count > _MAX_ARG_TOKENS:
                    return
                for prefix in ("$HOME", "${HOME}"):
                    if word == prefix or word.startswith(prefix + "/"):
                        word = home + word[len(prefix) :]
                if word == "~" or word.startswith("~/"):
                    yield arg, home + word[1:]
                elif word.startswith("/"):
                    yield arg, word
                elif "/" in word or word.startswith("."):
                    yield arg, os.path.join(cwd, word)

    def _exec(
        self,
        loaded: _Loaded,
        argv: list[str],
        cwd: str,
        credentials: list[str],
        steps: list[str] | None,
        *,
        env: Mapping[str, str],
    ) -> Decision:
        assert loaded.rules is not None
        rules = loaded.rules
        refused_env = environment.refused_names(env, rules.env.allow)
        if refused_env:
            names = ", ".join(refused_env)
            return Decision(
                "deny",
                "env.allow",
                f"exec.env sets {names}, which could change what the command loads or runs;"
                f" the owner may allow a name with [env] allow = [...] in {self.path}",
            )
        if steps is not None and env:
            steps.append(f"env: {', '.join(sorted(env))} (none reserved, or allowed by [env])")
        if self._is_endpointd(argv, cwd, env):
            return Decision(
                "deny",
                "endpointd",
                "a command may not run endpointd itself (its approvals, policy and credentials"
                " are the owner's alone)",
            )
        if not cwd:
            cwd = str(self.default_root)
            if steps is not None:
                steps.append(f"cwd: none given, so the default root {cwd}")
        refused = self._path(loaded, cwd, "cwd", steps)
        if refused is not None:
            return refused

        for arg, path in self._argv_paths(argv, cwd):
            hit = self._denied_hit(loaded, path)
            if hit is not None:
                rule = f"denied_paths: {hit.entry.label}"
                return Decision(
                    "deny",
                    rule,
                    f"argument {json.dumps(arg[:_QUOTE_LIMIT])} names a denied path ({rule} in"
                    f" {self.path})",
                )

        quoted = _quote(argv)
        chosen: Decision | None = None
        for command_rule in rules.commands:
            if glob_matches(command_rule.match, argv):
                if steps is not None:
                    steps.append(
                        f"command {quoted}: matches {command_rule.rule} -> {command_rule.action}"
                    )
                chosen = self._command_decision(command_rule.action, command_rule.rule, quoted)
                break
        if chosen is None:
            if steps is not None:
                steps.append(
                    f"command {quoted}: no [[commands]] rule matches -> default_action ="
                    f" {rules.default_action}"
                )
            chosen = self._command_decision(rules.default_action, "default_action", quoted)
        if chosen.action == "deny":
            return chosen
        if rules.sandbox == "required":
            missing = sandbox.support().missing(rules.network)
            if missing:
                return Decision(
                    "deny",
                    "sandbox",
                    'the local policy requires the sandbox (sandbox = "required") and this'
                    f" machine cannot enforce {'; '.join(missing)}; the owner may choose"
                    f' sandbox = "best-effort" or "off" in {self.path}',
                )
        if steps is not None:
            steps.append(f"sandbox: {sandbox.describe(rules.sandbox, rules.network)}")

        program: object = _UNSET
        for name in credentials:
            rule = f"credentials.{name}.allow"
            if not valid_name(name):
                return Decision(
                    "deny",
                    rule,
                    f"{name!r} is not a valid credential name ({NAME_RULE})",
                    Reason.CREDENTIAL_UNAVAILABLE,
                )
            scope = rules.credentials.get(name)
            if scope is not None and program is _UNSET:
                program = self.program_of(argv, cwd, env)
                if steps is not None:
                    steps.append(
                        f"program: {argv[0]} resolves to {program}"
                        if program
                        else f"program: {argv[0]} is not an executable on the command's PATH"
                    )
            if scope is None:
                return Decision(
                    "deny",
                    rule,
                    f"credential {name!r} has no scope in {self.path}, so it may not be delivered"
                    f' to any command: add [credentials.{name}] with allow = ["<command glob>"]',
                    Reason.CREDENTIAL_UNAVAILABLE,
                )
            resolved = program if isinstance(program, str) else None
            trusted = os.environ.get("PATH", os.defpath)
            matched = next(
                (g for g in scope.allow if scope_matches(g, resolved, argv, trusted)), None
            )
            if matched is None:
                globs = ", ".join(json.dumps(g) for g in scope.allow) or "none"
                runs = f" (it runs {resolved})" if resolved else ""
                return Decision(
                    "deny",
                    rule,
                    f"credential {name!r} may not be delivered to {quoted}{runs}: {rule} in"
                    f" {self.path} allows only {globs}, programs compared by their resolved"
                    " path",
                    Reason.CREDENTIAL_UNAVAILABLE,
                )
            assert resolved is not None
            why = code_running_reason(resolved, argv)
            if why is not None:
                return Decision(
                    "deny",
                    rule,
                    f"credential {name!r} may not be delivered to {quoted}: {why}",
                    Reason.CREDENTIAL_UNAVAILABLE,
                )
            if steps is not None:
                steps.append(f"credential {name}: allowed by {rule} {json.dumps(matched)}")
        return chosen

    def program_of(self, argv: Sequence[str], cwd: str, env: Mapping[str, str]) -> str | None:
        """The absolute path ``argv`` runs, found on the command's PATH (the daemon's unless
        the owner lets exec.env set it)."""
        path_var = env.get("PATH", os.environ.get("PATH", os.defpath))
        return resolve_program(argv[0], path_var, cwd) if argv else None

    def _is_endpointd(self, argv: Sequence[str], cwd: str, env: Mapping[str, str]) -> bool:
        """Is this endpointd itself, by its entry point or as ``python -m endpointd``?

        Defence in depth: in the sandbox a command can neither read endpointd's state nor
        write its approvals, so running it would achieve nothing anyway.
        """
        if not argv:
            return False
        program = self.program_of(argv, cwd, env)
        if program is not None and program in _endpointd_programs():
            return True
        name = os.path.basename(argv[0])
        if name.startswith("python") or (
            program and os.path.basename(program).startswith("python")
        ):
            for i, arg in enumerate(argv[1:-1], start=1):
                if arg == "-m" and argv[i + 1].split(".")[0] == "endpointd":
                    return True
                if arg.startswith("-m") and arg[2:].split(".")[0] == "endpointd":
                    return True
        return False

    @staticmethod
    def _command_decision(action: Action, rule: str, quoted: str) -> Decision:
        if action == "deny":
            return Decision("deny", rule, f"command {quoted} is denied by {rule}")
        if action == "ask":
            return Decision(
                "ask",
                rule,
                f"command {quoted} needs approval on the device ({rule}): `endpointd approvals`",
            )
        return Decision("allow", rule, f"command {quoted} is allowed by {rule}")

    # ------------------------------------------------------------------ file operations

    # Built-in protected write paths: what is written there can run code later, outside any
    # sandbox and without the agent asking (git runs hooks and obeys its config on the
    # user's next `git status`; shells source their start-up files; desktops and service
    # managers start what these directories list). Writes are denied unless a [[files]]
    # rule names them. Below the home directory: single files, then whole directories.
    _PROTECTED_HOME_FILES = (
        ".bashrc",
        ".bash_profile",
        ".bash_login",
        ".bash_logout",
        ".profile",
        ".zshrc",
        ".zshenv",
        ".zprofile",
        ".zlogin",
        ".zlogout",
        ".cshrc",
        ".tcshrc",
        ".login",
        ".config/fish/config.fish",
        ".gitconfig",
        ".config/git/config",
        ".xprofile",
        ".xsessionrc",
        ".pam_environment",
    )
    _PROTECTED_HOME_DIRS = (
        ".config/fish/conf.d",
        ".config/fish/functions",
        ".config/autostart",
        ".config/systemd/user",
        ".local/share/systemd/user",
        ".config/environment.d",
        "Library/LaunchAgents",
    )
    # The same beneath $XDG_CONFIG_HOME, when it is set.
    _PROTECTED_XDG_FILES = ("fish/config.fish", "git/config")
    _PROTECTED_XDG_DIRS = (
        "fish/conf.d",
        "fish/functions",
        "autostart",
        "systemd/user",
        "environment.d",
    )

    @staticmethod
    def _file_op(kind: str) -> FileOp:
        ops: dict[str, FileOp] = {"read_file": "read", "write_file": "write", "list_dir": "list"}
        return ops[kind]

    @staticmethod
    def _file_kind(op: FileOp) -> str:
        return {"read": "read_file", "write": "write_file", "list": "list_dir"}[op]

    def _file_decision(
        self, loaded: _Loaded, path: str, op: FileOp, steps: list[str] | None
    ) -> Decision:
        """Paths (denied, roots), then [[files]], then protected writes, then the default."""
        assert loaded.rules is not None
        rules = loaded.rules
        kind = self._file_kind(op)
        real = os.path.realpath(path)
        refused = self._path(loaded, path, f"{kind} path", steps, real=real)
        if refused is not None:
            return refused
        forms = tuple(dict.fromkeys(_fold(p) for p in (os.path.normpath(path), real)))
        for rule in rules.files:
            if op in rule.ops and any(fnmatch.fnmatchcase(f, _fold(rule.match)) for f in forms):
                if steps is not None:
                    steps.append(f"{kind} {path}: matches {rule.rule} -> {rule.action}")
                return self._file_rule_decision(rule.action, rule.rule, kind, path)
        if steps is not None:
            steps.append(f"{kind} {path}: no [[files]] rule for {op} matches")
        if op == "write":
            protected = self._protected(forms)
            if protected is not None:
                named = f"protected: {protected}"
                if steps is not None:
                    steps.append(f"{kind} {path}: a built-in protected path ({named}) -> deny")
                return Decision(
                    "deny",
                    named,
                    f"{kind} {path} is a protected path ({named}): what is written there can"
                    " run code later (git hooks and config, shell start-up files, autostart"
                    " entries, services), so it is never written unless a [[files]] rule in"
                    f" {self.path} names it",
                )
            if steps is not None:
                steps.append(f"{kind} {path}: not a protected path")
        if steps is not None:
            steps.append(f"{kind} {path}: default_action = {rules.default_action}")
        if rules.default_action == "allow":
            return Decision(
                "allow",
                "allowed_roots",
                f"{kind} {path} is inside an allowed root (no [[files]] rule matches;"
                " default_action = allow)",
            )
        return self._file_rule_decision(rules.default_action, "default_action", kind, path)

    def _file_rule_decision(self, action: Action, rule: str, kind: str, path: str) -> Decision:
        if action == "deny":
            return Decision("deny", rule, f"{kind} {path} is denied by {rule} in {self.path}")
        if action == "ask":
            return Decision(
                "ask",
                rule,
                f"{kind} {path} needs approval on the device ({rule}): `endpointd approvals`",
            )
        return Decision("allow", rule, f"{kind} {path} is allowed by {rule}")

    @staticmethod
    def _denied_in(loaded: _Loaded, forms: Iterable[str]) -> _Denied | None:
        """The denied path holding one of ``forms`` (a path as written and resolved)."""
        unique = set(forms)
        for denied in loaded.denied:
            for form in unique:
                if any(_within(form, d) for d in denied.forms):
                    return denied
        return None

    def _protected(self, forms: Sequence[str]) -> str | None:
        """The built-in protected path (its label) holding one of ``forms``, or None."""
        for form in forms:
            parts = form.split(os.sep)
            for i, part in enumerate(parts):
                if part != ".git":
                    continue
                below = parts[i + 1 :]
                if not below:
                    return ".git"  # a .git file points git at another directory's hooks
                if "hooks" in below:
                    return ".git/hooks"
                if below[-1] in ("config", "config.worktree"):
                    return ".git/config"
        places: list[tuple[str, str, Sequence[str], Sequence[str]]] = []
        home = str(self.home)
        for base in dict.fromkeys((os.path.normpath(home), os.path.realpath(home))):
            places.append(("~", base, self._PROTECTED_HOME_FILES, self._PROTECTED_HOME_DIRS))
        xdg = os.environ.get("XDG_CONFIG_HOME", "")
        if os.path.isabs(xdg):
            for base in dict.fromkeys((os.path.normpath(xdg), os.path.realpath(xdg))):
                places.append(
                    ("$XDG_CONFIG_HOME", base, self._PROTECTED_XDG_FILES, self._PROTECTED_XDG_DIRS)
                )
        for label, base, names, trees in places:
            for form in forms:
                for name in names:
                    if form == _fold(os.path.join(base, name)):
                        return f"{label}/{name}"
                for tree in trees:
                    if _within(form, os.path.join(base, tree)):
                        return f"{label}/{tree}"
        return None


@functools.cache
def _endpointd_programs() -> frozenset[str]:
    """Where this endpointd's entry point lives: the ``endpointd`` script beside the
    interpreter, on the daemon's PATH, and the one the daemon was started as."""
    found = set()
    candidates = [
        os.path.join(os.path.dirname(sys.executable), "endpointd"),
        shutil.which("endpointd") or "",
        sys.argv[0] if os.path.basename(sys.argv[0]) == "endpointd" else "",
    ]
    for candidate in candidates:
        if candidate and os.path.exists(candidate):
            found.add(os.path.realpath(candidate))
    return frozenset(found)


def _key_file(config_directory: Path) -> Path | None:
    """The device key file named by config.json, if the key lives in a file."""
    try:
        raw = json.loads((config_directory / "config.json").read_text(encoding="utf-8"))
        key = raw.get("key") or {}
        if key.get("storage") == "file" and key.get("path"):
            return Path(os.path.abspath(str(key["path"])))
    except (OSError, ValueError, AttributeError):
        pass
    return None


def load_policy(
    config_directory: Path,
    *,
    state_directory: Path | None = None,
    data_directory: Path | None = None,
) -> Policy:
    """The policy of ``<config_directory>/policy.toml`` (never raises: a broken file denies)."""
    return Policy(
        config_directory / POLICY_FILE, state_dir=state_directory, data_dir=data_directory
    )


# --------------------------------------------------------------------------- writing


def example_text() -> str:
    """The shipped, commented example policy (``allowed_roots = []``)."""
    return resources.files("endpointd").joinpath(EXAMPLE_FILE).read_text(encoding="utf-8")


_EMPTY_ROOTS = re.compile(r"^allowed_roots\s*=\s*\[\s*\][ \t]*$", re.M)


def _toml_string(value: str) -> str:
    # A JSON string is a valid TOML basic string (same escapes, \uXXXX included).
    return json.dumps(value, ensure_ascii=False)


def _with_roots(text: str, roots: Sequence[Path], path: Path) -> str:
    found = _EMPTY_ROOTS.findall(text)
    if len(found) != 1:
        raise PolicyError(
            path,
            "cannot fill in allowed_roots automatically (no single `allowed_roots = []` line);"
            " edit allowed_roots in the file",
        )
    listed = "".join(f"    {_toml_string(str(r))},\n" for r in roots)
    new = _EMPTY_ROOTS.sub(lambda _: f"allowed_roots = [\n{listed}]", text, count=1)
    check = parse_policy(new, path)
    if list(check.allowed_roots) != [expand_path(str(r)) for r in roots]:
        raise PolicyError(path, "the allowed roots cannot be written as TOML; edit the file")
    return new


def allowed_root(raw: str) -> Path:
    """A directory given on the command line or at the prompt, made absolute; ConfigError
    if it is not an existing directory."""
    text = raw.strip()
    if not text:
        raise ConfigError("an allowed root cannot be empty")
    path = expand_path(text)
    if not path.is_absolute():
        path = Path(os.path.abspath(path))
    if not path.is_dir():
        raise ConfigError(f"allowed root {raw!r} is not an existing directory")
    return path


RootsState = Literal["missing", "empty", "set"]


def roots_state(config_directory: Path) -> tuple[RootsState, list[Path]]:
    """Whether the policy file exists and lists allowed roots (PolicyError when broken)."""
    path = config_directory / POLICY_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return "missing", []
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(path, f"cannot read: {exc}") from None
    rules = parse_policy(text, path)
    if not rules.allowed_roots:
        return "empty", []
    return "set", list(rules.allowed_roots)


def write_policy(config_directory: Path, roots: Sequence[Path] = ()) -> Path:
    """Create policy.toml from the example, listing ``roots``; ConfigError if it exists."""
    path = config_directory / POLICY_FILE
    if path.exists():
        raise ConfigError(f"{path} already exists; edit it (`endpointd policy show` shows it)")
    text = example_text()
    if roots:
        text = _with_roots(text, roots, path)
    ensure_private_dir(config_directory)
    atomic_write(path, text.encode("utf-8"), mode=0o600)
    return path


def set_allowed_roots(config_directory: Path, roots: Sequence[Path]) -> tuple[Path, bool]:
    """Make the policy list ``roots``: a new file from the example, or the empty
    ``allowed_roots = []`` of an existing one filled in. Returns (path, created)."""
    path = config_directory / POLICY_FILE
    state, _ = roots_state(config_directory)
    if state == "missing":
        return write_policy(config_directory, roots), True
    if state == "set":
        raise PolicyError(path, "allowed_roots is already set; edit the file to change it")
    text = _with_roots(path.read_text(encoding="utf-8"), roots, path)
    atomic_write(path, text.encode("utf-8"), mode=0o600)
    return path, False
