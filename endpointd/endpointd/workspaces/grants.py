"""What a ticket's commands may write in its clone's git directory, beyond the workspace.

A worktree's commits land in the clone's common git directory: its objects, the branch's
ref, the branch's reflog, and the worktree's own admin directory (index, HEAD, logs). The
sandbox grants exactly those (:func:`write_grants`), taken from the workspace's record,
never from the workspace's ``.git`` file (a command can rewrite that):

* ``worktrees/<name>/``: the worktree's index, HEAD, its logs, rebase state;
* ``objects/00`` … ``objects/ff``: new loose objects. Landlock grants whole directories,
  and git removes its temporary files, so the loose objects already there could be
  removed too; packs (``objects/pack``) and ``objects/info`` (alternates) stay
  read-only, as does ``objects`` itself (no new directories, no maintenance lock);
* ``refs/heads/superagent/<ticket>/``: the ticket's branch, ``superagent/<ticket>/work``
  (:mod:`superagent_shared.branches`). git replaces a ref through a lock file beside it,
  so the grant is the directory, which holds this ticket's refs only: another ticket's
  branch and the user's own (``main``…) are not in it;
* ``refs/remotes/<remote>/superagent/<ticket>/``: what a push records of the branch;
* the branch's reflog and its remote-tracking reflog, as files: appended to, not replaced;
* nothing else: not the clone's working tree, ``config``, ``hooks``, ``packed-refs``,
  ``refs/stash`` or any other ref.

:func:`ensure` makes those directories and files exist before a command starts: git
removes empty fan-out directories and empty ref directories in its housekeeping, and a
grant on a path that does not exist grants nothing.
"""

from __future__ import annotations

import contextlib
import os

from endpointd.workspaces.store import Record
from superagent_shared import branches

__all__ = ["ensure", "read_grants", "write_grants"]

FAN_OUT = tuple(f"{i:02x}" for i in range(256))


def _paths(record: Record) -> tuple[list[str], list[str]]:
    common = record.common_dir
    folder = os.path.dirname(record.branch)  # superagent/<ticket>
    dirs = [record.admin_dir]
    dirs += [os.path.join(common, "objects", d) for d in FAN_OUT]
    dirs.append(os.path.join(common, "refs", "heads", folder))
    files = [os.path.join(common, "logs", "refs", "heads", record.branch)]
    if record.remote:
        dirs.append(os.path.join(common, "refs", "remotes", record.remote, folder))
        files.append(os.path.join(common, "logs", "refs", "remotes", record.remote, record.branch))
    return dirs, files


def _trusted(record: Record) -> bool:
    """A record endpointd completed for a worktree of a clone on its own branch."""
    return bool(
        record.state != "creating"
        and not record.in_place
        and record.common_dir
        and record.admin_dir
        and os.path.dirname(record.admin_dir) == os.path.join(record.common_dir, "worktrees")
        and branches.ticket_of(record.branch) == record.ticket
        and not record.remote.startswith(".")
        and "/" not in record.remote
    )


def write_grants(record: Record) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(directories, files) a command in this workspace may write besides the workspace."""
    if not _trusted(record):
        return (), ()
    dirs, files = _paths(record)
    return tuple(dirs), tuple(files)


def read_grants(record: Record) -> tuple[str, ...]:
    """What a command in this workspace sees of its clone, read-only: the common git
    directory (objects, refs, config), never the clone's working tree (the owner's
    checkout) nor another ticket's worktree."""
    return (record.common_dir,) if _trusted(record) else ()


def ensure(record: Record) -> None:
    """Create the granted directories and (empty) reflogs that are missing."""
    if not _trusted(record):
        return
    dirs, files = _paths(record)
    objects = os.path.join(record.common_dir, "objects")
    with contextlib.suppress(OSError):
        present = set(os.listdir(objects))
        for d in FAN_OUT:
            if d not in present:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(os.path.join(objects, d))
    for d in dirs:
        if not d.startswith(objects + os.sep):
            with contextlib.suppress(OSError):
                os.makedirs(d, exist_ok=True)
    for f in files:
        with contextlib.suppress(OSError):
            os.makedirs(os.path.dirname(f), exist_ok=True)
            os.close(os.open(f, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644))
