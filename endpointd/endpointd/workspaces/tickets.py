"""A ticket's commands work in its own workspace: where they may run, write and read.

A Command names the ticket it serves (``Command.ticket_id``, set by the control plane from
the job's ticket; empty for a command of no ticket, such as an admin's ``/run``). A worker
talked into it chooses any cwd and path it likes, so the device holds the line:

* a command of a ticket never touches another ticket's workspace
  (``<data dir>/workspaces/<other>``): no cwd, write, read or listing there;
* once the ticket has a workspace here (a record in the store: a worktree, or a directory
  used in place), its commands are **bound** to it: an exec's cwd must lie inside it (an
  empty cwd means the workspace itself), and its sandbox may write there (and in the
  clone's grants for its branch), not in the allowed root that holds it; a ``write_file``
  writes only inside it. The owner's checkout, which the worktree came from, is read-only
  to the ticket (it may still be read: the worker looks at the code there);
* a prepare or release of a ticket's workspace names that ticket.

Commands of no ticket, and of a ticket with no workspace here, keep the allowed roots' rules
(docs/endpointd/policy.md). The store is the daemon's (the state dir, denied to every command), so
no command can rebind itself.
"""

from __future__ import annotations

import os
from dataclasses import replace

from endpointd.guard.files import within
from endpointd.rules.decisions import Decision
from endpointd.workspaces.store import Store
from superagent_shared.messages import (
    Command,
    Exec,
    Glob,
    ListDir,
    PrepareWorkspace,
    ReadFile,
    ReleaseWorkspace,
    Search,
    WriteFile,
)

__all__ = ["RULE", "bind", "bound_workspace", "foreign", "refusal"]

RULE = "ticket workspace"


def bound_workspace(store: Store, command: Command) -> str | None:
    """The workspace (resolved) ``command``'s ticket is bound to, or None."""
    if not command.ticket_id:
        return None
    record = store.get(command.ticket_id)
    return os.path.realpath(record.path) if record is not None else None


def foreign(ticket: str, real: str, workspaces_root: str) -> str | None:
    """The other ticket whose workspace holds ``real`` (resolved), "" for the directory
    holding them all, None when neither (or ``ticket`` is empty: no ticket, no others)."""
    if not ticket:
        return None
    root = os.path.realpath(workspaces_root)
    if real == root:
        return ""
    if not within(real, root):
        return None
    owner = os.path.relpath(real, root).split(os.sep)[0]
    return owner if owner != ticket else None


def bind(store: Store, command: Command) -> Command:
    """``command`` with an exec's empty cwd made its ticket's workspace, when bound (the
    policy and the sandbox then judge where it really runs)."""
    op = command.op
    if isinstance(op, Exec) and not op.cwd:
        workspace = bound_workspace(store, command)
        if workspace is not None:
            return replace(command, op=replace(op, cwd=workspace))
    return command


def refusal(store: Store, command: Command, workspaces_root: str) -> Decision | None:
    """The deny decision when ``command`` reaches past its ticket's workspace, else None."""
    ticket = command.ticket_id
    if not ticket:
        return None
    op = command.op
    if isinstance(op, PrepareWorkspace | ReleaseWorkspace):
        if op.ticket_id != ticket:
            return _deny(
                f"{op.KIND} of ticket {op.ticket_id} sent for ticket {ticket}: a ticket prepares"
                " and releases only its own workspace"
            )
        return None
    if isinstance(op, Exec):
        place, what, write = op.cwd, "cwd", True
    elif isinstance(op, WriteFile):
        place, what, write = op.path, "write_file path", True
    elif isinstance(op, ReadFile | ListDir | Search | Glob):
        place, what, write = op.path, f"{op.KIND} path", False
    else:
        return None
    if not place:
        return None  # an exec of an unbound ticket: the default root, as before
    real = os.path.realpath(place)
    owner = foreign(ticket, real, workspaces_root)
    if owner:
        return _deny(
            f"{what} {place} is inside another ticket's workspace ({owner}); ticket"
            f" {ticket} works only in its own"
        )
    if owner == "":
        return _deny(
            f"{what} {place} holds every ticket's workspace; ticket {ticket} works only in its own"
        )
    workspace = bound_workspace(store, command)
    if workspace is None or not write or within(real, workspace):
        return None
    return _deny(
        f"{what} {place} is outside ticket {ticket}'s workspace {workspace}: its commands run"
        " and write only there (the checkout it came from is read-only to it)"
    )


def _deny(message: str) -> Decision:
    return Decision("deny", RULE, message)
