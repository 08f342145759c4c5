"""The name of a ticket's branch, which the device makes and the control plane names in
briefs and pull requests.

Each ticket's branch lies in a folder of its own, ``superagent/<ticket>/work``: git
replaces a ref through a lock file beside it, so a sandbox that lets a ticket's commands
move their own branch must let them write that branch's directory. A folder per ticket
makes that grant one ticket's refs, never another ticket's (a flat ``superagent/<ticket>``
would need ``refs/heads/superagent/`` writable whole).
"""

from __future__ import annotations

PREFIX = "superagent/"
LEAF = "work"


def ticket_branch(ticket_id: str) -> str:
    """The branch a ticket works on: ``superagent/<ticket>/work``."""
    return f"{PREFIX}{ticket_id}/{LEAF}"


def ticket_of(branch: str) -> str | None:
    """The ticket whose branch this is, or None for any other name."""
    if not (branch.startswith(PREFIX) and branch.endswith("/" + LEAF)):
        return None
    ticket = branch[len(PREFIX) : -len(LEAF) - 1]
    if not ticket or "/" in ticket or ticket in (".", "..") or ticket.startswith("."):
        return None
    return ticket
