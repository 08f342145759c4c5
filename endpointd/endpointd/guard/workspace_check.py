"""Judging a ticket workspace of a clone (``prepare_workspace``): the clone's place first,
then ``[workspaces]`` deny, ask, allow (globs over the repository), then the default."""

from __future__ import annotations

import fnmatch
import json
import os
from typing import TYPE_CHECKING, cast

from endpointd.guard.loaded import Loaded
from endpointd.guard.roots import no_roots_decision, path_refusal
from endpointd.rules.decisions import Decision
from endpointd.rules.remotes import remote_of
from endpointd.rules.terms import Action

if TYPE_CHECKING:
    from endpointd.guard.policy import Policy


def workspace_decision(policy: Policy, loaded: Loaded, path: str, repo: str) -> Decision:
    assert loaded.rules is not None
    if path:
        refused = path_refusal(policy, loaded, path, "prepare_workspace path", None)
        if refused is not None:
            return refused
        if policy.ticket_workspace(path) is not None:
            return Decision(
                "deny",
                "workspaces",
                f"prepare_workspace path {path} is a ticket's workspace, not a clone",
            )
        repo = repo or remote_of(os.path.realpath(path))
    elif not loaded.roots:
        return no_roots_decision(policy)
    rules = loaded.rules.workspaces
    name = repo.lower()
    what = f"a workspace of {repo}" if repo else f"a workspace of {path}"
    for action, globs in (("deny", rules.deny), ("ask", rules.ask), ("allow", rules.allow)):
        for glob in globs:
            if name and fnmatch.fnmatchcase(name, glob):
                rule = f"workspaces.{action} {json.dumps(glob)}"
                return _rule_decision(policy, cast(Action, action), rule, what)
    return _rule_decision(policy, loaded.rules.default_action, "default_action", what)


def _rule_decision(policy: Policy, action: Action, rule: str, what: str) -> Decision:
    if action == "deny":
        return Decision("deny", rule, f"{what} is denied by {rule} in {policy.path}")
    if action == "ask":
        return Decision(
            "ask", rule, f"{what} needs approval on the device ({rule}): `endpointd approvals`"
        )
    return Decision("allow", rule, f"{what} is allowed by {rule}")
