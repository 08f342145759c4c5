"""`endpointd policy check|show|init`: the local policy, explained."""

from __future__ import annotations

import json
from typing import Any

import click

from endpointd.cli.root import cli, echo_json, json_option
from endpointd.errors import EndpointdError
from endpointd.paths import config_dir, state_dir

# ---------------------------------------------------------------------------- policy


@cli.group("policy")
def policy_group() -> None:
    """Inspect the local policy: where the agent may work and what it may run.

    The policy file is policy.toml in the config dir (`endpointd info` shows where). It is
    yours: the control plane cannot change it, it only sees its hash. It lists allowed
    roots, denied paths, allow/deny/ask command rules, which commands may receive each
    credential, and limits; the shipped example documents every key. Edits apply at once.

    \b
    Examples:
      endpointd policy check "git push --force origin main"
      endpointd policy check --cwd ~/src/app --credential github-token git fetch
      endpointd policy check --path ~/.ssh/id_ed25519
      endpointd policy show
      endpointd policy init --allow-root ~/src
    """


_EXIT_CODES = {"allow": 0, "ask": 3, "deny": 4}


@policy_group.command("check")
@click.argument("command", nargs=-1)
@click.option("--cwd", metavar="DIR", help="Working directory (default: the first allowed root).")
@click.option(
    "--credential",
    "credentials",
    multiple=True,
    metavar="NAME",
    help="A credential the command asks for (repeatable).",
)
@click.option("--path", metavar="PATH", help="Check a file read, write or listing of PATH instead.")
@click.option(
    "--op",
    type=click.Choice(["read", "write", "list"]),
    default="read",
    show_default=True,
    help="With --path: which file operation (read_file, write_file, list_dir).",
)
@json_option()
@click.pass_context
def policy_check(
    ctx: click.Context,
    command: tuple[str, ...],
    cwd: str | None,
    credentials: tuple[str, ...],
    path: str | None,
    op: str,
    as_json: bool,
) -> None:
    """Explain which rule applies to a command and what it decides.

    COMMAND is one quoted command line (split like a shell would) or the argv words
    themselves (put `--` before words that start with a dash). Every step is shown: the
    working directory against the allowed roots and denied paths, the first matching
    command rule (or default_action), then each credential's scope. The exit status is the
    decision, for scripts: 0 allow, 3 ask (held for `endpointd approve`), 4 deny; 1 and 2
    are errors as for every command. With --path, the steps are the file operation's
    (--op): allowed roots and denied paths, the first matching [[files]] rule, the
    built-in protected paths (writes), then default_action.
    """
    import os
    import shlex

    from endpointd.guard.policy import load_policy
    from endpointd.rules.reader import expand_path
    from endpointd.rules.terms import FileOp
    from superagent_shared.messages import Command, CredentialRef, Exec

    if bool(path) == bool(command):
        raise click.UsageError("give either a COMMAND or --path PATH")
    policy = load_policy(config_dir().path, state_directory=state_dir().path)
    if path is not None:
        target = os.path.abspath(expand_path(path))
        file_op: FileOp = "write" if op == "write" else "list" if op == "list" else "read"
        decision = policy.check_path(target, file_op)
        explanation = policy.explain_path(target, file_op)
    else:
        try:
            argv = shlex.split(command[0]) if len(command) == 1 else list(command)
        except ValueError as exc:
            raise click.BadParameter(f"cannot split the command: {exc}") from None
        if not argv:
            raise click.BadParameter("the command is empty")
        where = os.path.abspath(expand_path(cwd)) if cwd else ""
        decision = policy.check(
            Command(
                op=Exec(argv=tuple(argv), cwd=where),
                credentials=tuple(CredentialRef(name=n) for n in credentials),
            )
        )
        explanation = policy.explain(argv, where or None, list(credentials))
    if as_json:
        report = {
            "action": decision.action,
            "rule": decision.rule,
            "message": decision.message,
            "explanation": explanation.splitlines(),
        }
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo(explanation)
    ctx.exit(_EXIT_CODES[decision.action])


@policy_group.command("show")
@json_option()
def policy_show(as_json: bool) -> None:
    """Print the policy file's path, its hash, the sandbox and the rules in effect.

    The hash is what this device reports to the control plane, so an admin can match it.
    It covers the file and the sandbox mode in effect on this machine (the same file hashes
    differently where the sandbox cannot be enforced).
    Defaults are included: denied paths built into endpointd are marked (default) and
    apply whatever the file says. If the file is missing or broken, that is said (and the
    exit status is 1): endpointd then refuses every command until it is fixed.
    """
    from endpointd.guard.policy import load_policy

    policy = load_policy(config_dir().path, state_directory=state_dir().path)
    rules = policy.rules
    report: dict[str, Any] = {
        "path": str(policy.path),
        "sha256": policy.hash().hex(),
        "error": policy.error,
        "sandbox": policy.sandbox_summary,
        "allowed_roots": [str(p) for p in policy.allowed_roots],
        "default_root": str(policy.default_root) if policy.allowed_roots else None,
        "denied_paths": [
            {"path": str(d.path), "label": d.label, "default": d.default}
            for d in policy.denied_paths
        ],
        "commands": [
            {"rule": c.rule, "action": c.action, "match": c.match, "name": c.name}
            for c in (rules.commands if rules else ())
        ],
        "default_action": rules.default_action if rules else None,
        "credentials": {
            k: {"allow": list(v.allow), "hosts": list(v.hosts), "header": v.header}
            for k, v in (rules.credentials if rules else {}).items()
        },
        "limits": {
            "max_runtime_seconds": policy.limits.max_runtime_seconds,
            "max_output_bytes": policy.limits.max_output_bytes,
            "ask_timeout_seconds": policy.limits.ask_timeout_seconds,
        },
        "workspaces": {
            "root": str(policy.workspaces_root),
            "deny": list(policy.workspace_rules.deny),
            "ask": list(policy.workspace_rules.ask),
            "allow": list(policy.workspace_rules.allow),
            "retention_hours": policy.workspace_rules.retention_hours,
            "max_disk_mb": policy.workspace_rules.max_disk_mb,
            "setup": {k: list(v) for k, v in policy.workspace_rules.setup.items()},
        },
    }
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        _print_policy(report)
    if policy.error is not None:
        raise EndpointdError(f"{policy.error} (every command is refused until this is fixed)")


def _print_policy(report: dict[str, Any]) -> None:
    click.echo(f"policy file: {report['path']}")
    click.echo(f"sha256:      {report['sha256']} (of the file and the sandbox mode in effect)")
    click.echo(f"sandbox:     {report['sandbox']}")
    if report["error"] is not None:
        return
    click.echo("allowed roots:")
    for root in report["allowed_roots"] or ["(none: every command is refused)"]:
        click.echo(f"  {root}")
    if report["default_root"]:
        click.echo(f"  (commands without a working directory run in {report['default_root']})")
    click.echo("denied paths:")
    for denied in report["denied_paths"]:
        note = "  (default)" if denied["default"] else ""
        shown = (
            denied["label"]
            if denied["label"] == denied["path"]
            else (f"{denied['label']} = {denied['path']}")
        )
        click.echo(f"  {shown}{note}")
    click.echo("commands (first match wins):")
    for rule in report["commands"]:
        click.echo(f"  {rule['action']:<5}  {rule['rule']}")
    click.echo(f"  {report['default_action']:<5}  default_action (when no rule matches)")
    click.echo("credential scopes:")
    if not report["credentials"]:
        click.echo("  (none: no credential can be delivered)")
    for name, globs in report["credentials"].items():
        click.echo(f"  {name}: {', '.join(globs) or '(empty: never delivered)'}")
    limits = report["limits"]
    click.echo(
        f"limits: max_runtime_seconds={limits['max_runtime_seconds']}"
        f" max_output_bytes={limits['max_output_bytes']}"
        f" ask_timeout_seconds={limits['ask_timeout_seconds']}"
    )
    ws = report["workspaces"]
    click.echo(f"workspaces: in {ws['root']}")
    for action in ("deny", "ask", "allow"):
        for glob in ws[action]:
            click.echo(f"  {action:<5}  {glob}")
    click.echo(
        f"  retention_hours={ws['retention_hours']} max_disk_mb={ws['max_disk_mb']}"
        f"; setup commands for: {', '.join(ws['setup']) or '(none)'}"
    )


@policy_group.command("init")
@click.option(
    "--allow-root",
    "allow_roots",
    multiple=True,
    metavar="DIR",
    help="A directory to list in allowed_roots (repeatable).",
)
@json_option()
def policy_init(allow_roots: tuple[str, ...], as_json: bool) -> None:
    """Write the documented example policy, if there is no policy file yet.

    The example explains every key and starts with default_action = "allow", a few deny
    and ask rules, and no credential scopes. Without --allow-root its allowed_roots list is
    empty, which refuses every command until you add a directory; `endpointd pair` writes
    the file the same way with the directories you give it.
    """
    from endpointd.rules.writer import allowed_root, write_policy

    roots = [allowed_root(raw) for raw in allow_roots]
    path = write_policy(config_dir().path, roots)
    if as_json:
        echo_json({"created": True, "path": str(path), "allowed_roots": [str(r) for r in roots]})
        return
    click.echo(f"wrote {path}")
    if not roots:
        click.echo("allowed_roots is empty: every command is refused until you add a directory")
