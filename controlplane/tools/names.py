"""Tool names more than one part of the control plane speaks of."""

from __future__ import annotations

__all__ = ["SUBAGENT"]

# The single-session baseline's tool (the router's, there), and what wakes the worker
# round it runs (:mod:`controlplane.workers.subagent`).
SUBAGENT = "subagent"
