"""The git commands endpointd itself runs on the user's clones (fetch, worktree, stash
create…): outside the sandbox, as the user, so with a configuration endpointd controls.

A command working in the owner's clone can write its ``.git``: its config, attributes,
hooks. Many config keys make git run a program (``url.*.insteadOf`` to ``ext::``,
``core.sshCommand``, credential helpers, filters, ``core.fsmonitor``, hooks,
``remote.*.uploadpack``, ``include.path``…), so the rule is an allow-list, not a list of
keys to switch off:

* **Network and content never read a clone's config.** ``ls-remote``, ``fetch``, the
  checkout of a new workspace and the local-changes snapshot run in a *shadow* git
  directory endpointd writes itself (:mod:`endpointd.workspaces.shadow`), with the
  clone's object store named by ``GIT_OBJECT_DIRECTORY``, the remote by its URL (read by
  endpointd's own parser, :mod:`endpointd.workspaces.remote_url`), and
  ``GIT_ALLOW_PROTOCOL`` naming the one transport that URL needs.
* **What still runs in the clone is plumbing** (``rev-parse``, ``show-ref``,
  ``update-ref``, ``for-each-ref``, ``worktree add --no-checkout``/``remove``/``prune``),
  which runs no configured program once :data:`_SAFE` is given on the command line (where
  it beats any config file): no hooks, no fsmonitor, no submodule recursion, no transport
  at all (``GIT_ALLOW_PROTOCOL`` empty, so no lazy fetch either), no askpass.
* **No system or global config** (``GIT_CONFIG_NOSYSTEM``, ``GIT_CONFIG_GLOBAL=/dev/null``),
  since with a root of ``~`` a command can write ``~/.gitconfig``. Configuration given in
  endpointd's own environment (``GIT_CONFIG_COUNT``/``GIT_CONFIG_KEY_n``/
  ``GIT_CONFIG_VALUE_n``) is the owner's, as its ``PATH`` is, and applies.
* **Confined while a workspace is prepared** (:mod:`endpointd.workspaces.jail`): Landlock
  keeps it out of the denied paths, lets it write only what the prepare writes, and
  connect only to the remote's port.
* **git is the one resolved at start** from directories no command can write
  (:mod:`endpointd.guard.daemon_programs`), and its ``PATH`` is those directories.
* The environment is an allow-list of endpointd's own (locale, home, the ssh agent, proxy
  and CA variables); no terminal (a new session, stdin from /dev/null,
  ``GIT_TERMINAL_PROMPT=0``).
* A failure is :class:`GitError`: one line, git's own last complaint, with any
  ``user:password@`` taken out of URLs; never a traceback.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence

from endpointd.guard import daemon_programs
from endpointd.workspaces import jail
from endpointd.workspaces.errors import GitError

__all__ = ["GitError", "environment", "git", "git_ok"]

DEFAULT_TIMEOUT = 120.0
FETCH_TIMEOUT = 600.0
# What git may take of endpointd's own environment.
_PASSED = (
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "TZ",
    "SSH_AUTH_SOCK",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "all_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
    "GIT_SSL_CAINFO",
    "GIT_SSL_CAPATH",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
)
# Given on the command line, where they beat every config file: no configured program runs
# in the plumbing that still reads a clone's config.
_SAFE = (
    ("core.hooksPath", "/dev/null"),
    ("core.fsmonitor", "false"),
    ("core.askPass", ""),
    ("submodule.recurse", "false"),
    ("protocol.allow", "never"),
    ("commit.gpgSign", "false"),
    ("gc.auto", "0"),
    ("maintenance.auto", "false"),
    ("fetch.recurseSubmodules", "false"),
)
_CREDENTIALS_IN_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]*@")
_MAX_MESSAGE = 300
_CONFIG_ENTRY = re.compile(r"GIT_CONFIG_(KEY|VALUE)_(\d+)\Z")


def _config_entries(env: Mapping[str, str]) -> list[tuple[str, str]]:
    """The ``GIT_CONFIG_COUNT`` entries of ``env``, in order."""
    try:
        count = int(env.get("GIT_CONFIG_COUNT", "0"))
    except ValueError:
        return []
    out = []
    for i in range(max(0, min(count, 1000))):
        key = env.get(f"GIT_CONFIG_KEY_{i}")
        if key is not None:
            out.append((key, env.get(f"GIT_CONFIG_VALUE_{i}", "")))
    return out


def _ssh_command() -> str:
    ssh = daemon_programs.which("ssh")
    # BatchMode: never a passphrase or host-key prompt (there is no terminal to answer it).
    return f"{shlex.quote(ssh or 'ssh')} -o BatchMode=yes"


def environment(extra: Mapping[str, str], protocol: str = "") -> dict[str, str]:
    """git's environment: an allow-list of endpointd's own, the owner's ``GIT_CONFIG_*``
    entries then ``extra``'s, no system or global config, and ``protocol`` the only
    transport allowed ("" none)."""
    env = {k: os.environ[k] for k in _PASSED if k in os.environ}
    env["PATH"] = daemon_programs.trusted_path() or os.defpath
    env["GIT_CONFIG_NOSYSTEM"] = "1"
    env["GIT_CONFIG_GLOBAL"] = os.devnull
    env["GIT_TERMINAL_PROMPT"] = "0"
    env["GIT_ASKPASS"] = ""  # set and empty: neither core.askPass nor SSH_ASKPASS is asked
    env["GIT_ALLOW_PROTOCOL"] = protocol
    env["GIT_NO_LAZY_FETCH"] = "1"
    env["GIT_SSH_COMMAND"] = _ssh_command()
    env["LC_ALL"] = "C"
    # The fallback identity of a commit made here (the local changes' snapshot): no
    # config is read for one.
    env["EMAIL"] = "superagent@localhost"
    env["GIT_AUTHOR_NAME"] = env["GIT_COMMITTER_NAME"] = "superagent"
    entries = _config_entries(os.environ) + _config_entries(extra)
    env.update({k: v for k, v in extra.items() if not k.startswith("GIT_CONFIG_")})
    for i, (key, value) in enumerate(entries):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    env["GIT_CONFIG_COUNT"] = str(len(entries))
    return env


def _complaint(stderr: str, stdout: str) -> str:
    lines = [line.strip() for line in (stderr or stdout).splitlines() if line.strip()]
    flagged = [line for line in lines if line.startswith(("fatal:", "error:"))]
    text = (flagged or lines or ["no message"])[-1]
    text = _CREDENTIALS_IN_URL.sub(r"\1", text)
    return text if len(text) <= _MAX_MESSAGE else text[:_MAX_MESSAGE] + "…"


def _run(
    args: Sequence[str],
    cwd: str,
    timeout: float,
    env: Mapping[str, str],
    protocol: str,
    on_start: Callable[[int], None] | None = None,
    connect_ports: Sequence[int] = (),
) -> subprocess.CompletedProcess[str]:
    program = daemon_programs.which("git")
    if program is None:
        raise GitError(
            "git is not installed in a directory endpointd trusts (on its PATH, outside the"
            " home directory and every place commands may write)"
        )
    safe = [a for key, value in _SAFE for a in ("-c", f"{key}={value}")]
    argv = [program, *safe, *args]
    full_env = environment(env, protocol)
    confinement = jail.current()
    if confinement is not None:
        argv, added = jail.wrap(argv, confinement, connect_ports=connect_ports, protocol=protocol)
        full_env.update(added)
    try:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,
        )
    except OSError as exc:
        raise GitError(f"cannot run git in {cwd}: {exc.strerror or exc}") from None
    if on_start is not None:
        on_start(proc.pid)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: git and its helpers
        proc.communicate()
        raise GitError(f"git {args[0]} took longer than {timeout:.0f} s") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def git(
    *args: str,
    cwd: str,
    timeout: float = DEFAULT_TIMEOUT,
    env: Mapping[str, str] | None = None,
    what: str = "",
    on_start: Callable[[int], None] | None = None,
    protocol: str = "",
    connect_ports: Sequence[int] = (),
) -> str:
    """git's output (stripped); :class:`GitError` naming ``what`` (else the git command)
    and git's own complaint when it fails. ``on_start``: told git's pid as it starts (the
    credential helper answers only that process tree). ``protocol``: the one transport
    git may use (none by default); ``connect_ports``: the TCP ports it may connect to while
    confined (:mod:`endpointd.workspaces.jail`; none by default)."""
    done = _run(args, cwd, timeout, env or {}, protocol, on_start, connect_ports)
    if done.returncode != 0:
        action = what or f"git {args[0]}"
        raise GitError(f"{action} failed: {_complaint(done.stderr, done.stdout)}")
    return done.stdout.strip()


def git_ok(*args: str, cwd: str, timeout: float = DEFAULT_TIMEOUT) -> bool:
    """Whether the git command succeeds (for questions: does this ref exist?)."""
    return _run(args, cwd, timeout, {}, "").returncode == 0
