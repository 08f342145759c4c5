"""The policy file's content as typed tables: one dataclass per table of ``policy.toml``,
validated by :mod:`endpointd.rules.parser`, and the paths denied whatever the file says."""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from endpointd.rules.credentials import Store
from endpointd.rules.harnesses import HOME_STATE
from endpointd.rules.terms import (
    DEFAULT_HEADER,
    FILE_OPS,
    Action,
    FileOp,
    NetworkMode,
    SandboxMode,
)

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
    # Coding-agent CLIs' own state: their logins, every project's transcripts, and what they
    # run next time the owner starts them (Claude Code sources ~/.claude/shell-snapshots
    # before each command). A harness run works in a store of its own, with its login
    # linked in read-only (endpointd.harness.stores).
    *HOME_STATE,
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
    and the names a command's ``exec.env`` may set besides locale and output settings
    (``allow``)."""

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
    # Repositories (globs) whose own .superagent/setup may run on prepare; none by default:
    # it is the repository authors' code, not the owner's.
    repository_setup: tuple[str, ...] = ()

    def runs_repository_setup(self, repo: str) -> bool:
        """Does the owner let repository ``repo``'s own ``.superagent/setup`` run?"""
        return bool(repo) and any(
            fnmatch.fnmatchcase(repo.lower(), glob) for glob in self.repository_setup
        )

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
    # How long a run's session store is kept after its last run, for a resume (0: removed
    # when the run ends).
    keep_sessions_hours: int = 72

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
    # What commands may read besides the system and their workspace (read-only); None:
    # the built-in toolchain directories (endpointd.guard.view.HOME_TOOLCHAINS).
    readable_paths: tuple[Path, ...] | None = None
    # Directories in the home directory the daemon may run its own programs from (git, rg,
    # a harness's --version), read at its start; never one inside an allowed root or a
    # writable path.
    program_paths: tuple[Path, ...] = ()
    env: EnvRules = field(default_factory=EnvRules)
    files: tuple[FileRule, ...] = ()
    workspaces: WorkspaceRules = field(default_factory=WorkspaceRules)
    harness: HarnessRules = field(default_factory=HarnessRules)
    # Where `endpointd creds add` puts new values; None: not set (the keyring).
    credential_store: Store | None = None
