"""Which harnesses are installed here, their versions, and whether each can log in.

For the RepositoryReport (:class:`Harnesses`, kept current by the connection) and for
`endpointd harness list` (:func:`detect`). All of it is local and cheap except the version,
which runs ``<program> --version`` (a few seconds at most, never on the event loop: the
callers run this in a thread) and is remembered per executable until it changes or the
rescan interval passes.

A harness is *installed* when its program is found: ``[harness.NAME] program`` in the
policy, else its usual name on the daemon's PATH. Its ``--version`` runs only when
the program lies in a directory no command can write (see :func:`detect`). It is
*logged in* when it has something to authenticate with: the credential the policy names
for it is stored, its own login file exists (``~/.qwen/oauth_creds.json``,
``~/.codex/auth.json``,
``~/.claude/.credentials.json``), its settings hold a key, or its key variable is in the
daemon's environment and passed to commands (``[env] pass``: a run starts from a minimal
environment, so a key the daemon has but does not pass never reaches it). Only existence
is ever looked at: a value is never read into a report, a log or an error, and a settings
file is parsed only to see whether a key field is set.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from endpointd.guard import daemon_programs
from endpointd.rules.environment import BASE
from endpointd.rules.harnesses import HARNESSES, NAMES, Spec, owner_logins
from endpointd.rules.tables import HarnessRules, HarnessSettings, Rules
from superagent_shared.messages import Harness

__all__ = ["Found", "Harnesses", "detect", "find_program", "version_of"]

VERSION_TIMEOUT_SECONDS = 5.0
VERSION_CHARS = 80
RESCAN_SECONDS = 600.0


@dataclass(frozen=True)
class Found:
    """One harness as this device sees it."""

    name: str
    program: str | None  # absolute path; None: not installed
    version: str  # "" when not installed or it did not answer
    login: str  # what it would log in with ("credential NAME", "~/.codex/auth.json", …); ""
    allowed: bool
    default: bool

    @property
    def spec(self) -> Spec:
        return HARNESSES[self.name]

    @property
    def logged_in(self) -> bool:
        return bool(self.login)

    def report(self) -> Harness:
        return Harness(self.name, self.version, self.allowed, self.logged_in)


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def find_program(name: str, settings: HarnessSettings, path_var: str | None = None) -> str | None:
    """The absolute path of harness ``name``'s program, or None when it is not installed:
    the policy's ``program`` (which must exist), else its usual name on ``path_var`` (the
    daemon's PATH)."""
    if settings.program is not None:
        return str(settings.program) if _executable(str(settings.program)) else None
    if path_var is None:
        path_var = os.environ.get("PATH", os.defpath)
    found = shutil.which(HARNESSES[name].program, path=path_var)
    return os.path.abspath(found) if found else None


def version_of(program: str, environ: Mapping[str, str] | None = None) -> str:
    """The first line of ``program --version`` (capped, printable), or "" when it does not
    answer within the timeout or fails. Its whole process group goes at the timeout (a
    node script's children too)."""
    environ = os.environ if environ is None else environ
    env = {k: environ[k] for k in BASE if k in environ}
    # An interpreter the program names through `env` (#!/usr/bin/env node) is found where
    # the daemon finds its own programs, never in a directory a command could write.
    env["PATH"] = daemon_programs.trusted_path() or os.defpath
    try:
        proc = subprocess.Popen(
            [program, "--version"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    except OSError:
        return ""
    try:
        out, _ = proc.communicate(timeout=VERSION_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return ""
    if proc.returncode != 0:
        return ""
    lines = out.decode("utf-8", "replace").strip().splitlines()
    first = lines[0].strip() if lines else ""
    return "".join(c for c in first if c.isprintable())[:VERSION_CHARS]


def _shown(path: Path, home: Path) -> str:
    return f"~/{path.relative_to(home)}" if path.is_relative_to(home) else str(path)


def _settings_key(spec: Spec, settings: Path) -> bool:
    """Does the harness's settings file set a key (at one of its known places)?"""
    try:
        data = json.loads(settings.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    for path in spec.settings_keys:
        node: object = data
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, str) and node.strip():
            return True
    return False


def login_of(
    name: str,
    settings: HarnessSettings,
    *,
    home: Path,
    environ: Mapping[str, str],
    passed: Collection[str],
    stored: Collection[str],
) -> str:
    """What harness ``name`` would authenticate with (see the module doc), or ""."""
    spec = HARNESSES[name]
    if settings.credential and settings.credential in stored:
        return f"credential {settings.credential}"
    # Where the owner's CLI keeps them: below home, or where its variable moved them.
    logins = owner_logins(spec, home, environ)
    for path in logins[: len(spec.login_files)]:
        if path.is_file():
            return _shown(path, home)
    if spec.settings_file and _settings_key(spec, logins[-1]):
        return _shown(logins[-1], home)
    for var in spec.key_env:
        if environ.get(var) and var in passed:
            return f"${var}"
    return ""


class _Versions:
    """``--version`` answers per executable (path, inode, mtime), for RESCAN_SECONDS."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._lock = threading.Lock()
        self._known: dict[str, tuple[tuple[int, int, int], float, str]] = {}

    def get(self, program: str, environ: Mapping[str, str]) -> str:
        try:
            st = os.stat(program)
        except OSError:
            return ""
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        with self._lock:
            known = self._known.get(program)
            if known is not None and known[0] == stamp and time.monotonic() - known[1] < self.ttl:
                return known[2]
        version = version_of(program, environ)
        with self._lock:
            self._known[program] = (stamp, time.monotonic(), version)
        return version


def detect(
    rules: Rules | None,
    *,
    home: Path | None = None,
    environ: Mapping[str, str] | None = None,
    stored: Collection[str] = (),
    versions: _Versions | None = None,
    untrusted: Callable[[str], str] | None = None,
) -> tuple[Found, ...]:
    """Every harness endpointd knows, as found here under ``rules`` (None: a broken policy,
    so none is allowed). ``stored``: the names of the stored credentials. ``untrusted``:
    why a program may not be run by the daemon itself ("" when it may; by default, unless
    it lies in a directory no command can write, :mod:`endpointd.guard.daemon_programs`):
    such a program is reported without asking its version, since ``--version`` runs
    outside the sandbox."""
    if untrusted is None:
        untrusted = daemon_programs.current().why_untrusted
    home = Path.home() if home is None else home
    environ = os.environ if environ is None else environ
    harness = rules.harness if rules is not None else HarnessRules()
    passed = rules.env.passed if rules is not None else ()
    path_var = environ.get("PATH", os.defpath)
    out = []
    for name in NAMES:
        settings = harness.settings_for(name)
        program = find_program(name, settings, path_var)
        version = ""
        if program is not None and not untrusted(program):
            version = versions.get(program, environ) if versions else version_of(program, environ)
        out.append(
            Found(
                name=name,
                program=program,
                version=version,
                login=login_of(
                    name, settings, home=home, environ=environ, passed=passed, stored=stored
                ),
                allowed=rules is not None and harness.allows(name),
                default=harness.default == name,
            )
        )
    return tuple(out)


class Harnesses:
    """The harnesses found here, for the RepositoryReport: detected again on every call
    (a few stats), their versions run once per executable and again after
    ``rescan_seconds`` (thread-safe; callers run it in a thread)."""

    def __init__(self, *, rescan_seconds: float = RESCAN_SECONDS) -> None:
        self._versions = _Versions(rescan_seconds)

    def current(
        self, rules: Rules | None, *, stored: Collection[str] = (), home: Path | None = None
    ) -> tuple[Found, ...]:
        return detect(rules, home=home, stored=stored, versions=self._versions)
