"""The git clones under the allowed roots, found cheaply, for the RepositoryReport and for
finding the clone a PrepareWorkspace names by its repository.

The walk lists directories (``os.scandir``, no git process, no symlink followed) down to
:data:`MAX_DEPTH` below each root, and stops at :data:`MAX_REPOSITORIES` clones or
:data:`MAX_DIRECTORIES` directories listed, saying so (``truncated``). It never descends
into a clone it found (submodules and vendored checkouts are the clone's business), nor
into hidden directories, dependency and build trees (:data:`SKIPPED`) or denied paths.
A clone is a directory holding a ``.git`` directory; linked worktrees (a ``.git`` file) and
bare repositories are not reported.

:class:`Repositories` keeps the last scan and scans again when the roots or the denied
paths change, or once it is :data:`RESCAN_SECONDS` old (new clones appear).
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from endpointd.rules.remotes import Clone, read_clone

__all__ = ["Repositories", "Scan", "scan"]

MAX_DEPTH = 4
MAX_REPOSITORIES = 200
# A home directory as a root can hold a great many directories; the walk stays cheap.
MAX_DIRECTORIES = 20_000
RESCAN_SECONDS = 600.0
# Never walked into: dependencies, build output, caches, virtualenvs.
SKIPPED = frozenset(
    {
        "node_modules",
        "vendor",
        "venv",
        "env",
        "__pycache__",
        "site-packages",
        "target",
        "build",
        "dist",
        "out",
        "bower_components",
        "Pods",
        "DerivedData",
        "Library",
    }
)


@dataclass(frozen=True)
class Scan:
    repositories: tuple[Clone, ...]
    truncated: bool  # a bound was reached: there may be more
    scanned_at: float


def scan(
    roots: Sequence[str],
    *,
    denied: Callable[[str], bool] = lambda _: False,
    max_depth: int = MAX_DEPTH,
    max_repositories: int = MAX_REPOSITORIES,
    max_directories: int = MAX_DIRECTORIES,
) -> Scan:
    """The clones at most ``max_depth`` levels below each of ``roots`` (resolved
    directories), sorted by path; ``denied(path)`` says which directories are off limits."""
    found: dict[str, Clone] = {}
    truncated = False
    listed = 0
    queue: deque[tuple[str, int]] = deque()
    for root in dict.fromkeys(os.path.realpath(r) for r in roots):
        if os.path.isdir(root) and not denied(root):
            queue.append((root, 0))
    while queue:
        directory, depth = queue.popleft()
        if listed >= max_directories:
            truncated = True
            break
        listed += 1
        if os.path.isdir(os.path.join(directory, ".git")) and not os.path.islink(
            os.path.join(directory, ".git")
        ):
            clone = read_clone(directory)
            if clone is not None and directory not in found:
                if len(found) >= max_repositories:
                    truncated = True
                    break
                found[directory] = clone
            continue  # never into a clone
        try:
            with os.scandir(directory) as entries:
                children = sorted(
                    e.path
                    for e in entries
                    if e.is_dir(follow_symlinks=False)
                    and not e.name.startswith(".")
                    and e.name not in SKIPPED
                )
        except OSError:
            continue
        if depth >= max_depth:
            truncated = truncated or bool(children)
            continue
        queue.extend((child, depth + 1) for child in children if not denied(child))
    return Scan(tuple(found[p] for p in sorted(found)), truncated, time.time())


class Repositories:
    """The latest scan of the allowed roots, shared by the report and by PrepareWorkspace
    (thread-safe: scans run in worker threads)."""

    def __init__(self, *, rescan_seconds: float = RESCAN_SECONDS) -> None:
        self.rescan_seconds = rescan_seconds
        self._lock = threading.Lock()
        self._scan: Scan | None = None
        self._key: tuple[tuple[str, ...], tuple[str, ...]] | None = None
        self._at = 0.0

    def current(
        self,
        roots: Sequence[str],
        denied_paths: Sequence[str],
        denied: Callable[[str], bool],
        *,
        force: bool = False,
    ) -> Scan:
        """The last scan, or a new one when the roots or denied paths changed, when it is
        old, or when ``force``."""
        key = (tuple(roots), tuple(denied_paths))
        with self._lock:
            fresh = time.monotonic() - self._at < self.rescan_seconds
            if self._scan is not None and key == self._key and fresh and not force:
                return self._scan
            result = scan(roots, denied=denied)
            self._scan, self._key, self._at = result, key, time.monotonic()
            return result
