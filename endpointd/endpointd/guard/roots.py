"""Where a command may act: inside an allowed root or its ticket's workspace, and outside
every denied path. The first check of every command that names a place."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from endpointd.guard.files import within as _within
from endpointd.guard.loaded import Loaded, denied_in
from endpointd.rules.decisions import Decision
from endpointd.rules.terms import POLICY_FILE

if TYPE_CHECKING:
    from endpointd.guard.policy import Policy


def broken_decision(loaded: Loaded) -> Decision:
    """What every command gets while the policy file cannot be used."""
    return Decision(
        "deny",
        POLICY_FILE,
        f"the local policy cannot be used, so every command is refused: {loaded.error}",
    )


def no_roots_decision(policy: Policy) -> Decision:
    return Decision(
        "deny",
        "allowed_roots",
        f"no allowed roots are configured: add a directory to allowed_roots in {policy.path}",
    )


def path_refusal(
    policy: Policy,
    loaded: Loaded,
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
    hit = denied_in(loaded, (os.path.normpath(path), real))
    if hit is not None:
        rule = f"denied_paths: {hit.entry.label}"
        return Decision(
            "deny", rule, f"{what} {path} is inside a denied path ({rule} in {policy.path})"
        )
    workspace = policy.ticket_workspace(real)
    if workspace is not None:
        if steps is not None:
            steps.append(f"{what} {path}: inside the ticket workspace {workspace}")
        return None
    if not loaded.roots:
        return no_roots_decision(policy)
    for root in loaded.roots:
        if _within(real, root.real):
            if steps is not None:
                steps.append(f"{what} {path}: inside allowed root {root.written} (allowed_roots)")
            return None
    resolved = f" (it resolves to {real})" if real != os.path.normpath(path) else ""
    roots = ", ".join(str(r.written) for r in loaded.roots)
    return Decision(
        "deny",
        "allowed_roots",
        f"{what} {path}{resolved} is outside the allowed roots ({roots}; allowed_roots in"
        f" {policy.path})",
    )
