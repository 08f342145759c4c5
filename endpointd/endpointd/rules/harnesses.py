"""What endpointd knows of each harness: how to find it, how to tell it is logged in, where
it keeps its sessions, and how a non-interactive run's command line is built.

The control plane only names a harness and gives the prompt, a session to resume, a turn
limit and a timeout; everything that becomes a program, a flag or a credential comes from
here and from the owner's policy (``[harness]``, :mod:`endpointd.rules.read_harness`). The prompt
always travels on standard input, never argv (argv is visible to every process on the
machine and lands in the owner's rules and logs).

Each harness runs with its own approval prompts switched off: nobody is at the terminal
to answer them, and the boundary is ours (the local policy judges the real argv, the OS
sandbox confines the whole process tree, the redactor masks its output).

Sources the flags rely on (checked against the CLI's help or source, as noted):

* Qwen Code 0.24 (``@qwen-code/qwen-code``, run for real in the tests): ``qwen --help``:
  the prompt is read from stdin when no positional prompt is given; ``--safe-mode``;
  ``--output-format
  stream-json``; ``--approval-mode yolo``; ``--auth-type openai`` (without it, and
  without an auth type in its settings, a non-interactive run stops with "No auth type is
  selected"); ``-m``; ``--openai-base-url``; ``--max-session-turns``; ``-r/--resume ID``.
  ``QWEN_CODE_SUPPRESS_YOLO_WARNING=1`` keeps its warning out of the event stream. Its
  OpenAI key comes from ``OPENAI_API_KEY``. All its state lives in ``~/.qwen``, or in
  ``$QWEN_HOME`` when set (``Storage.getGlobalQwenDir``), runtime output included unless
  ``QWEN_RUNTIME_DIR`` moves it; a run writes its chat to
  ``projects/<cwd with non-alphanumerics as ->/chats/<session>.jsonl`` there. Its login is
  ``oauth_creds.json`` there, or a key in ``settings.json``.
* Codex CLI (``@openai/codex``): openai/codex ``codex-rs/exec/src/cli.rs``: ``codex exec
  [OPTIONS] [PROMPT]`` reads the prompt from stdin when it is ``-``; ``codex exec resume
  SESSION_ID -`` continues a session; ``--json`` prints JSONL events; ``--skip-git-repo-check``;
  ``-m``; ``--dangerously-bypass-approvals-and-sandbox`` (global to exec's subcommands);
  ``-c key=value`` config overrides (``openai_base_url``, as its own exec tests use it).
  ``codex-rs/login``: ``CODEX_API_KEY`` (``codex exec`` only) and ``OPENAI_API_KEY``;
  ``~/.codex/auth.json`` is its login; sessions go to
  ``~/.codex/sessions/YYYY/MM/DD/rollout-<time>-<session>.jsonl`` and a history to
  ``~/.codex/history.jsonl``. It has no turn limit flag. developers.openai.com "Environment
  variables": ``CODEX_HOME`` is the root of all its state (config, auth, logs, sessions)
  and must exist; ``CODEX_SQLITE_HOME`` its SQLite state (default: ``CODEX_HOME``).
* Claude Code (``@anthropic-ai/claude-code``): docs.claude.com "Headless mode" and "CLI
  reference": ``claude -p`` (print, non-interactive; the prompt from stdin when none is
  given), ``--output-format stream-json`` (which needs ``--verbose``), ``--max-turns``,
  ``--resume SESSION_ID``, ``--model``, ``--permission-mode bypassPermissions``. Key:
  ``ANTHROPIC_API_KEY``; login ``~/.claude/.credentials.json``; sessions under
  ``~/.claude/projects/<cwd with non-alphanumerics as ->/<session>.jsonl``, shell
  snapshots in ``~/.claude/shell-snapshots``, global state in ``~/.claude.json``.
  ``CLAUDE_CONFIG_DIR`` moves all of it, ``.claude.json`` included, into that directory
  ("Settings", environment variables).

Codex and Claude Code are not installed on the machines the tests run on: their command
lines and store variables are unit-tested, and their runs tested with stand-in programs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["HARNESSES", "HOME_STATE", "NAMES", "Run", "Spec", "moved_state", "owner_logins"]


@dataclass(frozen=True)
class Run:
    """What a run's argv is built from: the owner's settings and the request's fields."""

    program: str
    model: str = ""
    base_url: str = ""
    max_turns: int = 0  # 0: no limit flag
    resume_session: str = ""
    openai_key: bool = False  # a key is delivered for an OpenAI-compatible endpoint


@dataclass(frozen=True)
class Spec:
    name: str
    title: str
    program: str  # its executable's name on PATH
    npm: str  # the npm package that installs it
    credential_env: str  # where a credential named for it is delivered, by default
    key_env: tuple[str, ...]  # variables its own login reads a key from
    login_files: tuple[str, ...]  # below the home directory: its own login
    # Below the home directory: all its own state (login, configuration, every project's
    # sessions). Denied to every command; a run works in a store of its own instead.
    home_state: tuple[str, ...]
    # The variables that move all that state elsewhere: each run gets its own store there
    # (endpointd.harness.stores).
    store_env: tuple[str, ...]
    argv: Callable[[Run], list[str]]
    env: Mapping[str, str] = field(default_factory=dict)
    base_url: bool = False  # it speaks to an OpenAI-compatible base URL the owner may set
    max_turns: bool = False  # it has a turn limit flag
    # Its own login counts when a settings file below home holds a key at one of these paths.
    settings_file: str = ""
    settings_keys: tuple[tuple[str, ...], ...] = ()


def _qwen_argv(run: Run) -> list[str]:
    # --safe-mode: none of the owner's customisations (hooks, MCP servers, extensions,
    # skills, context files). They are programs and instructions the owner set up for
    # their own sessions, often holding their own credentials; a worker's run should not
    # start them. It is also what lets a run work without write access to ~/.qwen: without
    # it qwen prepares its extension store (~/.qwen/extension-store, ~/.qwen/extensions)
    # at every start, which a run must never be able to write (a staged extension is
    # installed, and run unconfined, the next time the owner starts qwen). Repository
    # instructions reach a run through the control plane's brief instead.
    argv = [run.program, "--safe-mode", "--output-format", "stream-json", "--approval-mode", "yolo"]
    if run.openai_key or run.base_url:
        argv += ["--auth-type", "openai"]
    if run.model:
        argv += ["--model", run.model]
    if run.base_url:
        argv += ["--openai-base-url", run.base_url]
    if run.max_turns:
        argv += ["--max-session-turns", str(run.max_turns)]
    if run.resume_session:
        argv += ["--resume", run.resume_session]
    return argv


def _codex_argv(run: Run) -> list[str]:
    # Its own sandbox off: ours confines the whole process tree already, and Codex's nested
    # one (Landlock + seccomp through its helper) fails inside a sandbox that denies it
    # what it sets up (user namespaces, its own ruleset), leaving a run that cannot do
    # anything. Its approvals are off with it: nobody is at the terminal.
    argv = [
        run.program,
        "exec",
        "--json",
        "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox",
    ]
    if run.model:
        argv += ["--model", run.model]
    if run.base_url:
        argv += ["-c", f"openai_base_url={json.dumps(run.base_url)}"]
    if run.resume_session:
        argv += ["resume", run.resume_session]
    return [*argv, "-"]  # the prompt from stdin


def _claude_argv(run: Run) -> list[str]:
    argv = [
        run.program,
        "--print",
        "--output-format",
        "stream-json",
        "--verbose",
        "--permission-mode",
        "bypassPermissions",
    ]
    if run.model:
        argv += ["--model", run.model]
    if run.max_turns:
        argv += ["--max-turns", str(run.max_turns)]
    if run.resume_session:
        argv += ["--resume", run.resume_session]
    return argv


HARNESSES: Mapping[str, Spec] = {
    "qwen": Spec(
        name="qwen",
        title="Qwen Code",
        program="qwen",
        npm="@qwen-code/qwen-code",
        credential_env="OPENAI_API_KEY",
        key_env=("OPENAI_API_KEY",),
        login_files=(".qwen/oauth_creds.json",),
        home_state=(".qwen",),
        store_env=("QWEN_HOME", "QWEN_RUNTIME_DIR"),
        argv=_qwen_argv,
        env={"QWEN_CODE_SUPPRESS_YOLO_WARNING": "1"},
        base_url=True,
        max_turns=True,
        settings_file=".qwen/settings.json",
        settings_keys=(("security", "auth", "apiKey"), ("env", "OPENAI_API_KEY")),
    ),
    "codex": Spec(
        name="codex",
        title="Codex CLI",
        program="codex",
        npm="@openai/codex",
        credential_env="CODEX_API_KEY",
        key_env=("CODEX_API_KEY", "OPENAI_API_KEY"),
        login_files=(".codex/auth.json",),
        home_state=(".codex",),
        store_env=("CODEX_HOME", "CODEX_SQLITE_HOME"),
        argv=_codex_argv,
        base_url=True,
    ),
    "claude": Spec(
        name="claude",
        title="Claude Code",
        program="claude",
        npm="@anthropic-ai/claude-code",
        credential_env="ANTHROPIC_API_KEY",
        key_env=("ANTHROPIC_API_KEY",),
        login_files=(".claude/.credentials.json",),
        home_state=(".claude", ".claude.json", ".claude.json.backup"),
        store_env=("CLAUDE_CONFIG_DIR",),
        argv=_claude_argv,
        max_turns=True,
    ),
}

NAMES: tuple[str, ...] = tuple(HARNESSES)

# Every harness's own state below the home directory, as "~/..." (denied to every command:
# rules.tables.DEFAULT_DENIED_PATHS).
HOME_STATE: tuple[str, ...] = tuple(
    f"~/{entry}" for spec in HARNESSES.values() for entry in spec.home_state
)


def moved_state(spec: Spec, environ: Mapping[str, str]) -> tuple[tuple[str, Path], ...]:
    """Where the owner moved the harness's state with its variables (``CLAUDE_CONFIG_DIR``,
    ``CODEX_HOME`` and ``CODEX_SQLITE_HOME``, ``QWEN_HOME`` and ``QWEN_RUNTIME_DIR``) in
    endpointd's own environment, which the owner's CLI shares: each variable set to an
    absolute path, and that directory."""
    out = []
    for var in spec.store_env:
        value = environ.get(var, "")
        if value and "\0" not in value and os.path.isabs(value):
            out.append((var, Path(os.path.normpath(value))))
    return tuple(out)


def owner_logins(spec: Spec, home: Path, environ: Mapping[str, str]) -> tuple[Path, ...]:
    """The owner's own login files of the harness (and its settings file, which may hold a
    key): in its moved directory when the owner moved it, else below home."""
    wanted = [*spec.login_files, *((spec.settings_file,) if spec.settings_file else ())]
    main = dict(moved_state(spec, environ)).get(spec.store_env[0])
    if main is None:
        return tuple(home / relative for relative in wanted)
    return tuple(main / Path(relative).name for relative in wanted)
