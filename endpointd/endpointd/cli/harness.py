"""`endpointd harness list`: the coding-agent CLIs this machine could run for the agent."""

from __future__ import annotations

import json
from typing import Any

import click

from endpointd.cli.root import cli, json_option
from endpointd.paths import config_dir, state_dir
from superagent_shared import table

# ---------------------------------------------------------------------------- harness


@cli.group()
def harness() -> None:
    """Coding-agent CLIs (Qwen Code, Codex CLI, Claude Code) the agent may run here.

    Instead of its built-in worker, the control plane can ask this machine to run a
    coding-agent CLI you installed and logged in to, non-interactively, in a ticket's
    workspace. It only names the harness and gives the instruction: the program, its
    flags, its model and its key come from your policy.toml, and the run is an ordinary
    command to endpointd (your [[commands]] rules see its real command line, the sandbox
    confines it, its output is masked). Each run keeps its state in a session store of
    its own that endpointd makes for it, never in your ~/.claude, ~/.codex or ~/.qwen
    (no command may read or write those); your login for that harness is readable, never
    writable, by its runs alone.

    Nothing runs until you allow it: running a CLI spends your subscription or key.

    \b
    In policy.toml:
      [harness]
      default = "qwen"              # the one this machine prefers for its tickets
      allowed = ["qwen", "codex"]   # which the control plane may run here
      keep_sessions_hours = 72      # how long a run's store is kept for a resume
      [harness.qwen]
      program = "/abs/path/qwen"    # default: `qwen` on endpointd's PATH
      model = "qwen3-coder-plus"    # default: its own setting
      base_url = "https://…/v1"     # OpenAI-compatible endpoint (qwen, codex)
      credential = "qwen-key"       # stored with `endpointd creds add qwen-key`
      credential_env = "OPENAI_API_KEY"   # where it is delivered (default per harness)
      max_turns = 50                # cap on the turns a run may take

    \b
    Examples:
      endpointd harness list
      endpointd harness list --json
    """


def _rows() -> tuple[list[dict[str, Any]], str | None, str, tuple[str, ...]]:
    """The harnesses as found now; why the policy cannot be used (None: it can); its path;
    its ``[harness] allowed`` list."""
    from endpointd.guard import daemon_programs
    from endpointd.guard.policy import load_policy
    from endpointd.harness.detect import detect
    from endpointd.secrets.store import CredentialError, CredentialStore

    policy = load_policy(config_dir().path, state_directory=state_dir().path)
    # --version runs only for programs where the daemon would run them.
    daemon_programs.configure_for(policy, config_dir().path, state_dir().path)
    try:
        stored = CredentialStore(config_dir().path).names()
    except CredentialError as exc:
        click.echo(f"warning: {exc}", err=True)
        stored = []
    rows = []
    for found in detect(policy.rules, stored=stored):
        spec = found.spec
        rows.append(
            {
                "name": found.name,
                "title": spec.title,
                "installed": found.program is not None,
                "path": found.program,
                "version": found.version,
                "logged_in": found.logged_in,
                "login": found.login,
                "allowed": found.allowed,
                "default": found.default,
                "npm": spec.npm,
            }
        )
    allowed = policy.rules.harness.allowed if policy.rules is not None else ()
    return rows, policy.error, str(policy.path), allowed


@harness.command("list")
@json_option()
def harness_list(as_json: bool) -> None:
    """Show each harness: version, where it is installed, whether it is logged in, and
    whether the agent may run it here (ALLOWED) and prefers it (DEFAULT).

    Installed: [harness.NAME] program in policy.toml, else the harness's usual name on
    endpointd's PATH. Logged in: the credential [harness.NAME] credential names is
    stored, or its own login exists (~/.qwen/oauth_creds.json, a key in
    ~/.qwen/settings.json, ~/.codex/auth.json, ~/.claude/.credentials.json), or its key
    variable is in endpointd's environment and passed to commands ([env] pass). Only
    whether something exists is looked at, never a value. Below the table: what to do
    for each one that is missing something. The daemon reports the same to the control
    plane (installed ones only), and again whenever it changes.
    """
    from endpointd.guard.approvals import printable

    rows, error, path, allowed_now = _rows()
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if error is not None:
        click.echo(f"warning: {error}", err=True)
    header = ("NAME", "VERSION", "INSTALLED", "LOGGED IN", "ALLOWED", "DEFAULT")
    cells = []
    for r in rows:
        cells.append(
            (
                r["name"],
                printable(r["version"] or "-", 40),
                printable(r["path"]) if r["installed"] else "no",
                f"yes ({r['login']})" if r["logged_in"] else "no",
                "yes" if r["allowed"] else "no",
                "yes" if r["default"] else "",
            )
        )
    for line in table.render(header, cells):
        click.echo(line)
    hints = []
    for r in rows:
        name = r["name"]
        if not r["installed"]:
            hints.append(
                f"{name}: install it with `npm install -g {r['npm']}` (or set"
                f" [harness.{name}] program in {path})"
            )
        if not r["logged_in"]:
            hints.append(
                f"{name}: give it a key with `endpointd creds add {name}-key` and"
                f' [harness.{name}] credential = "{name}-key" in {path}, or log in to it'
                " by hand once"
            )
        if not r["allowed"]:
            listed = ", ".join(f'"{a}"' for a in (*allowed_now, name))
            hints.append(
                f"{name}: let the agent run it with [harness] allowed = [{listed}] in {path}"
            )
    if hints:
        click.echo("")
        for hint in hints:
            click.echo(printable(hint, None))
