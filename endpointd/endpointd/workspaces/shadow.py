"""A git directory endpointd writes itself, for the git work that must not read a clone's
config: talking to the remote, checking a new workspace out, snapshotting local changes.

:func:`shadow` makes one in endpointd's private scratch directory (0700, in the state dir,
which no command can reach): ``config`` holds only the repository format, ``HEAD`` and
``packed-refs`` what endpointd puts there. The clone's object store is named by
``GIT_OBJECT_DIRECTORY``, so what git fetches or commits lands in the clone, and what it
checks out comes from there. git reads no other config (see
:mod:`endpointd.workspaces.git`): no filter, hook, helper, rewrite or ssh command a
command may have written into the clone applies.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from endpointd.paths import ensure_private_dir
from endpointd.workspaces.errors import WorkspaceError

__all__ = ["Shadow", "shadow"]

_OBJECT_NAME = re.compile(r"[0-9a-f]{40}([0-9a-f]{24})?\Z")
_REF_NAME = re.compile(r"refs/[A-Za-z0-9._/+-]+\Z")


@dataclass(frozen=True)
class Shadow:
    git_dir: str
    objects: str

    def env(self, *, work_tree: str = "", index: str = "") -> dict[str, str]:
        """git's environment for working here on the clone's objects (and ``work_tree``
        with ``index``, for a checkout or a snapshot)."""
        env = {"GIT_DIR": self.git_dir, "GIT_OBJECT_DIRECTORY": self.objects}
        if work_tree:
            env["GIT_WORK_TREE"] = work_tree
        if index:
            env["GIT_INDEX_FILE"] = index
        return env

    def set_head(self, commit: str) -> None:
        if not _OBJECT_NAME.match(commit):
            raise WorkspaceError(f"not a commit: {commit!r}")
        Path(self.git_dir, "HEAD").write_text(commit + "\n", encoding="ascii")

    def set_refs(self, refs: Iterable[tuple[str, str]]) -> None:
        """Refs the fetch may offer the remote as what it already has (so it sends only
        what is new); names and object ids as git printed them, checked."""
        lines = sorted(
            f"{oid} {name}\n"
            for oid, name in refs
            if _OBJECT_NAME.match(oid) and _REF_NAME.match(name) and ".." not in name
        )
        Path(self.git_dir, "packed-refs").write_text("".join(lines), encoding="ascii")


@contextlib.contextmanager
def shadow(scratch: Path, objects: str, object_format: str = "sha1") -> Iterator[Shadow]:
    """A fresh shadow git directory over the object store ``objects``, removed after."""
    if object_format not in ("sha1", "sha256"):
        raise WorkspaceError(f"the clone's object format {object_format!r} is not supported")
    ensure_private_dir(scratch)
    git_dir = tempfile.mkdtemp(prefix="shadow-", dir=scratch)
    try:
        for sub in ("objects", "refs/heads", "refs/tags", "info"):
            os.makedirs(os.path.join(git_dir, sub), exist_ok=True)
        config = ["[core]\n", "\tbare = false\n", "\tlogAllRefUpdates = false\n"]
        if object_format == "sha256":
            config[1:1] = ["\trepositoryformatversion = 1\n"]
            config.append(f"[extensions]\n\tobjectFormat = {object_format}\n")
        else:
            config[1:1] = ["\trepositoryformatversion = 0\n"]
        Path(git_dir, "config").write_text("".join(config), encoding="ascii")
        Path(git_dir, "HEAD").write_text("ref: refs/heads/unborn\n", encoding="ascii")
        yield Shadow(git_dir, os.path.realpath(objects))
    finally:
        shutil.rmtree(git_dir, ignore_errors=True)
