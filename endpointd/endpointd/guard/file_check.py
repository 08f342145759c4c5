"""Judging a file operation (read, write, list; a search reads, a glob lists): the path's
place first, then the first ``[[files]]`` rule for the operation, then, for writes, the
built-in protected paths, then ``default_action``."""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from endpointd.guard.files import fold as _fold
from endpointd.guard.files import within as _within
from endpointd.guard.loaded import Loaded
from endpointd.guard.roots import path_refusal
from endpointd.rules.decisions import Decision
from endpointd.rules.terms import Action, FileOp

if TYPE_CHECKING:
    from endpointd.guard.policy import Policy

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


def file_op(kind: str) -> FileOp:
    ops: dict[str, FileOp] = {"read_file": "read", "write_file": "write", "list_dir": "list"}
    return ops[kind]


def _file_kind(op: FileOp) -> str:
    return {"read": "read_file", "write": "write_file", "list": "list_dir"}[op]


def file_decision(
    policy: Policy, loaded: Loaded, path: str, op: FileOp, steps: list[str] | None
) -> Decision:
    """Paths (denied, roots), then [[files]], then protected writes, then the default."""
    assert loaded.rules is not None
    rules = loaded.rules
    kind = _file_kind(op)
    real = os.path.realpath(path)
    refused = path_refusal(policy, loaded, path, f"{kind} path", steps, real=real)
    if refused is not None:
        return refused
    forms = tuple(dict.fromkeys(_fold(p) for p in (os.path.normpath(path), real)))
    for rule in rules.files:
        if op in rule.ops and any(fnmatch.fnmatchcase(f, _fold(rule.match)) for f in forms):
            if steps is not None:
                steps.append(f"{kind} {path}: matches {rule.rule} -> {rule.action}")
            return _rule_decision(policy, rule.action, rule.rule, kind, path)
    if steps is not None:
        steps.append(f"{kind} {path}: no [[files]] rule for {op} matches")
    if op == "write":
        refused = _protected_write(policy, forms, kind, path, steps)
        if refused is not None:
            return refused
    if steps is not None:
        steps.append(f"{kind} {path}: default_action = {rules.default_action}")
    if rules.default_action == "allow":
        return Decision(
            "allow",
            "allowed_roots",
            f"{kind} {path} is inside an allowed root (no [[files]] rule matches;"
            " default_action = allow)",
        )
    return _rule_decision(policy, rules.default_action, "default_action", kind, path)


def _protected_write(
    policy: Policy, forms: Sequence[str], kind: str, path: str, steps: list[str] | None
) -> Decision | None:
    """The refusal of a write to a built-in protected path, else None."""
    protected = _protected(forms, str(policy.home))
    if protected is None:
        if steps is not None:
            steps.append(f"{kind} {path}: not a protected path")
        return None
    named = f"protected: {protected}"
    if steps is not None:
        steps.append(f"{kind} {path}: a built-in protected path ({named}) -> deny")
    return Decision(
        "deny",
        named,
        f"{kind} {path} is a protected path ({named}): what is written there can"
        " run code later (git hooks and config, shell start-up files, autostart"
        " entries, services), so it is never written unless a [[files]] rule in"
        f" {policy.path} names it",
    )


def _rule_decision(policy: Policy, action: Action, rule: str, kind: str, path: str) -> Decision:
    if action == "deny":
        return Decision("deny", rule, f"{kind} {path} is denied by {rule} in {policy.path}")
    if action == "ask":
        return Decision(
            "ask",
            rule,
            f"{kind} {path} needs approval on the device ({rule}): `endpointd approvals`",
        )
    return Decision("allow", rule, f"{kind} {path} is allowed by {rule}")


def _protected(forms: Sequence[str], home: str) -> str | None:
    """The built-in protected path (its label) holding one of ``forms``, or None."""
    git = _git_protected(forms)
    if git is not None:
        return git
    places: list[tuple[str, str, Sequence[str], Sequence[str]]] = []
    for base in dict.fromkeys((os.path.normpath(home), os.path.realpath(home))):
        places.append(("~", base, _PROTECTED_HOME_FILES, _PROTECTED_HOME_DIRS))
    xdg = os.environ.get("XDG_CONFIG_HOME", "")
    if os.path.isabs(xdg):
        for base in dict.fromkeys((os.path.normpath(xdg), os.path.realpath(xdg))):
            places.append(("$XDG_CONFIG_HOME", base, _PROTECTED_XDG_FILES, _PROTECTED_XDG_DIRS))
    for label, base, names, trees in places:
        for form in forms:
            for name in names:
                if form == _fold(os.path.join(base, name)):
                    return f"{label}/{name}"
            for tree in trees:
                if _within(form, os.path.join(base, tree)):
                    return f"{label}/{tree}"
    return None


def _git_protected(forms: Sequence[str]) -> str | None:
    """``.git``, ``.git/hooks`` or ``.git/config`` when one of ``forms`` is one of them."""
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
    return None
