"""Judging an exec: its environment, that it is not endpointd itself, its cwd and the paths
its arguments name, the first ``[[commands]]`` rule that matches (else ``default_action``),
the sandbox the policy requires, then each credential's scope. Deny beats ask beats allow.

``steps``, when given, collects why, one line per step (`endpointd policy check`).
"""

from __future__ import annotations

import fnmatch
import functools
import json
import os
import re
import shutil
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from endpointd.guard import daemon_programs, sandbox
from endpointd.guard.loaded import Loaded, denied_hit
from endpointd.guard.programs import code_running_reason, resolve_program, scope_matches
from endpointd.guard.roots import path_refusal
from endpointd.rules import environment
from endpointd.rules.credentials import NAME_RULE, valid_name
from endpointd.rules.decisions import Decision
from endpointd.rules.tables import Rules
from endpointd.rules.terms import Action
from superagent_shared.messages import Reason

if TYPE_CHECKING:
    from endpointd.guard.policy import Policy

# How much of a command line a message quotes: enough to recognise it, not a wall of text.
_QUOTE_LIMIT = 200
_MAX_ARG_TOKENS = 2000
_TOKEN_SPLIT = re.compile(r"""[\s'"=;|&<>()`,]+""")


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


def exec_decision(
    policy: Policy,
    loaded: Loaded,
    argv: list[str],
    cwd: str,
    credentials: list[str],
    steps: list[str] | None,
    *,
    env: Mapping[str, str],
    env_from_device: bool = False,
) -> Decision:
    """``env_from_device``: the environment was built by this device (a harness run's, from
    its harness table), not asked for by the control plane, so the allow-list of names the
    control plane may set does not apply to it."""
    assert loaded.rules is not None
    rules = loaded.rules
    refused = None if env_from_device else _env_refusal(policy, rules, env, steps)
    if refused is not None:
        return refused
    if is_endpointd(argv, cwd, env):
        return Decision(
            "deny",
            "endpointd",
            "a command may not run endpointd itself (its approvals, policy and credentials"
            " are the owner's alone)",
        )
    if not cwd:
        cwd = str(policy.default_root)
        if steps is not None:
            steps.append(f"cwd: none given, so the default root {cwd}")
    refused = path_refusal(policy, loaded, cwd, "cwd", steps) or _argv_refusal(
        policy, loaded, argv, cwd
    )
    if refused is not None:
        return refused
    chosen = _command_rule_decision(rules, argv, steps)
    if chosen.action == "deny":
        return chosen
    refused = _sandbox_refusal(policy, rules, steps)
    if refused is not None:
        return refused
    refused = _credentials_refusal(policy, rules, argv, cwd, env, credentials, steps)
    return chosen if refused is None else refused


def _env_refusal(
    policy: Policy, rules: Rules, env: Mapping[str, str], steps: list[str] | None
) -> Decision | None:
    """exec.env may set only the names of an allow-list: presentation and locale
    (:data:`endpointd.rules.environment.SETTABLE`) and what the owner allows by name. Almost
    any other variable can make some program load or run code (``MAKEFILES``,
    ``RUSTC_WRAPPER``, ``npm_config_*``, …), and no list of those is ever complete."""
    refused_env = environment.refused_names(env, rules.env.allow)
    if refused_env:
        names = ", ".join(refused_env)
        return Decision(
            "deny",
            "env.allow",
            f"exec.env sets {names}, which the control plane may not set here: a variable"
            " can change what a program loads or runs, so only names the owner allows are"
            f" accepted (besides locale and output settings such as LANG, TZ, NO_COLOR);"
            f" the owner may allow a name with [env] allow = [...] in {policy.path}",
        )
    if steps is not None and env:
        steps.append(f"env: {', '.join(sorted(env))} (settable, or allowed by [env])")
    return None


def _argv_refusal(policy: Policy, loaded: Loaded, argv: Sequence[str], cwd: str) -> Decision | None:
    """An argument naming a denied path: a clear refusal up front (the sandbox is what
    actually keeps the command out)."""
    for arg, path in _argv_paths(argv, cwd, str(policy.home)):
        hit = denied_hit(loaded, path)
        if hit is not None:
            rule = f"denied_paths: {hit.entry.label}"
            return Decision(
                "deny",
                rule,
                f"argument {json.dumps(arg[:_QUOTE_LIMIT])} names a denied path ({rule} in"
                f" {policy.path})",
            )
    return None


def _argv_paths(argv: Sequence[str], cwd: str, home: str) -> Iterable[tuple[str, str]]:
    """(argument, path) for every argv word that names a path, best effort."""
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


def _command_rule_decision(rules: Rules, argv: Sequence[str], steps: list[str] | None) -> Decision:
    """The first ``[[commands]]`` rule matching ``argv`` decides, else ``default_action``."""
    quoted = _quote(argv)
    for command_rule in rules.commands:
        if glob_matches(command_rule.match, argv):
            if steps is not None:
                steps.append(
                    f"command {quoted}: matches {command_rule.rule} -> {command_rule.action}"
                )
            return _command_decision(command_rule.action, command_rule.rule, quoted)
    if steps is not None:
        steps.append(
            f"command {quoted}: no [[commands]] rule matches -> default_action ="
            f" {rules.default_action}"
        )
    return _command_decision(rules.default_action, "default_action", quoted)


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


def _sandbox_refusal(policy: Policy, rules: Rules, steps: list[str] | None) -> Decision | None:
    """Under ``sandbox = "required"``, a machine that cannot confine the command refuses it."""
    if rules.sandbox == "required":
        missing = sandbox.support().missing(rules.network)
        if missing:
            return Decision(
                "deny",
                "sandbox",
                'the local policy requires the sandbox (sandbox = "required") and this'
                f" machine cannot enforce {'; '.join(missing)}; the owner may choose"
                f' sandbox = "best-effort" or "off" in {policy.path}',
            )
    if steps is not None:
        steps.append(f"sandbox: {sandbox.describe(rules.sandbox, rules.network)}")
    return None


def _credentials_refusal(
    policy: Policy,
    rules: Rules,
    argv: Sequence[str],
    cwd: str,
    env: Mapping[str, str],
    credentials: list[str],
    steps: list[str] | None,
) -> Decision | None:
    """Each credential needs a scope whose ``allow`` names the program ``argv`` runs
    (resolved), and the program may not run code the command supplies."""
    quoted = _quote(argv)
    program: str | None = None
    resolved_once = False
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
        if scope is not None and not resolved_once:
            program, resolved_once = program_of(argv, cwd, env), True
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
                f"credential {name!r} has no scope in {policy.path}, so it may not be delivered"
                f' to any command: add [credentials.{name}] with allow = ["<command glob>"]',
                Reason.CREDENTIAL_UNAVAILABLE,
            )
        # A scope's program word is looked up where the daemon finds its own programs:
        # never in a directory a command could have planted a `git` in.
        trusted = daemon_programs.trusted_path()
        matched = next((g for g in scope.allow if scope_matches(g, program, argv, trusted)), None)
        if matched is None:
            globs = ", ".join(json.dumps(g) for g in scope.allow) or "none"
            runs = f" (it runs {program})" if program else ""
            return Decision(
                "deny",
                rule,
                f"credential {name!r} may not be delivered to {quoted}{runs}: {rule} in"
                f" {policy.path} allows only {globs}, programs compared by their resolved"
                " path",
                Reason.CREDENTIAL_UNAVAILABLE,
            )
        assert program is not None
        why = code_running_reason(program, argv)
        if why is not None:
            return Decision(
                "deny",
                rule,
                f"credential {name!r} may not be delivered to {quoted}: {why}",
                Reason.CREDENTIAL_UNAVAILABLE,
            )
        if steps is not None:
            steps.append(f"credential {name}: allowed by {rule} {json.dumps(matched)}")
    return None


def program_of(argv: Sequence[str], cwd: str, env: Mapping[str, str]) -> str | None:
    """The absolute path ``argv`` runs, found on the command's PATH (the daemon's unless
    the owner lets exec.env set it)."""
    path_var = env.get("PATH", os.environ.get("PATH", os.defpath))
    return resolve_program(argv[0], path_var, cwd) if argv else None


def is_endpointd(argv: Sequence[str], cwd: str, env: Mapping[str, str]) -> bool:
    """Is this endpointd itself, by its entry point or as ``python -m endpointd``?

    Defence in depth: in the sandbox a command can neither read endpointd's state nor
    write its approvals, so running it would achieve nothing anyway.
    """
    if not argv:
        return False
    program = program_of(argv, cwd, env)
    if program is not None and program in _endpointd_programs():
        return True
    name = os.path.basename(argv[0])
    if name.startswith("python") or (program and os.path.basename(program).startswith("python")):
        for i, arg in enumerate(argv[1:-1], start=1):
            if arg == "-m" and argv[i + 1].split(".")[0] == "endpointd":
                return True
            if arg.startswith("-m") and arg[2:].split(".")[0] == "endpointd":
                return True
    return False


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
