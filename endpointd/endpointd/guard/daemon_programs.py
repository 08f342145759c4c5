"""The programs endpointd itself runs outside the sandbox (git, ripgrep, ssh, a harness's
``--version``, the desktop notifier), resolved from directories no command can write.

A confined command may write its workspace, its allowed root and the owner's
``writable_paths``. A ``PATH`` directory there (``~/.local/bin`` under a root of ``~``)
would turn a planted ``git`` into code the daemon runs as the owner, unconfined. So the
daemon's ``PATH`` is filtered, once, when the daemon starts (:func:`configure`): a
directory is kept only when it is absolute and, resolved, lies outside the home
directory (but for the directories the owner lists in the policy's ``program_paths``),
the allowed roots, the writable paths and endpointd's own directories, and it
and every directory above it belong to root or to the daemon's user and are writable by
no one else. A program found there is kept only if its resolved file passes the same test
(a symlink out of ``/usr/bin`` into a writable place does not count). Each name is looked
up once and remembered.

Nothing here runs a program: it only says which file to run.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from endpointd.guard.policy import Policy

__all__ = ["DaemonPrograms", "configure", "current", "trusted_path", "which"]


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _owned_safely(path: str) -> str:
    """Why ``path`` or a directory above it could be changed by someone else ("" if not).

    A directory above it may be one everybody writes if it is root's and sticky (``/tmp``):
    there nobody but its owner can rename or remove an entry, and the entry below it is
    judged in turn. ``path`` itself never may: anybody could add a program to it."""
    uid = os.geteuid()
    current = path
    while True:
        try:
            st = os.lstat(current)
        except OSError as exc:
            return f"{current}: {exc.strerror or exc}"
        if st.st_uid not in (0, uid):
            return f"{current} belongs to another user (uid {st.st_uid})"
        sticky_root_dir = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX and st.st_uid == 0
        if st.st_mode & 0o022 and (current == path or not sticky_root_dir):
            return f"{current} is writable by group or others"
        parent = os.path.dirname(current)
        if parent == current:
            return ""
        current = parent


@dataclass
class DaemonPrograms:
    """The daemon's trusted ``PATH`` and the programs found on it."""

    directories: tuple[str, ...]
    untrusted: tuple[str, ...]  # where commands may write, and endpointd's directories
    skipped: tuple[tuple[str, str], ...] = ()  # (directory, why it is not used)
    home: str = ""  # never used, but for what the owner lists in program_paths
    home_allowed: tuple[str, ...] = ()
    _found: dict[str, str | None] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def path(self) -> str:
        """The trusted directories as a ``PATH`` value."""
        return os.pathsep.join(self.directories)

    def why_untrusted(self, path: str) -> str:
        """Why the (resolved) file or directory ``path`` is not one the daemon may run
        from ("" when it may)."""
        real = os.path.realpath(path)
        for place in self.untrusted:
            if _within(real, place):
                return f"{real} is inside {place}, where commands may write"
        if (
            self.home
            and _within(real, self.home)
            and not any(_within(real, a) for a in self.home_allowed)
        ):
            return f"{real} is inside the home directory (and not in the policy's program_paths)"
        return _owned_safely(real)

    def which(self, name: str) -> str | None:
        """The absolute, resolved path of ``name`` on the trusted directories, or None."""
        with self._lock:
            if name in self._found:
                return self._found[name]
        found: str | None = None
        if name and "/" not in name:
            for directory in self.directories:
                candidate = os.path.join(directory, name)
                if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                    real = os.path.realpath(candidate)
                    if not self.why_untrusted(real):
                        found = real
                        break
        with self._lock:
            self._found[name] = found
        return found


def resolve(
    path_var: str | None,
    untrusted: Iterable[Path | str],
    home_allowed: Iterable[Path | str] = (),
) -> DaemonPrograms:
    """The trusted subset of ``path_var``, given the places commands may write; of the
    home directory only ``home_allowed`` (the policy's ``program_paths``), and of those
    only the ones holding no place commands may write."""
    places = tuple(sorted({os.path.realpath(p) for p in untrusted if str(p)}))
    allowed = tuple(
        a
        for a in (os.path.realpath(p) for p in home_allowed if str(p))
        if not any(_within(a, w) or _within(w, a) for w in places)
    )
    home = os.path.realpath(Path.home())
    kept: list[str] = []
    skipped: list[tuple[str, str]] = []
    probe = DaemonPrograms((), places, home=home, home_allowed=allowed)
    for entry in (path_var if path_var is not None else os.defpath).split(os.pathsep):
        if not entry or not os.path.isabs(entry):
            skipped.append((entry, "not an absolute directory"))
            continue
        real = os.path.realpath(entry)
        if not os.path.isdir(real):
            continue
        why = probe.why_untrusted(real)
        if why:
            skipped.append((entry, why))
        elif real not in kept:
            kept.append(real)
    return DaemonPrograms(tuple(kept), places, tuple(skipped), home, allowed)


_current: DaemonPrograms | None = None
_current_lock = threading.Lock()


def configure(
    untrusted: Sequence[Path | str],
    home_allowed: Sequence[Path | str] = (),
    path_var: str | None = None,
) -> DaemonPrograms:
    """Resolve the daemon's programs now (at start): ``untrusted`` are the places commands
    may write (allowed roots, writable paths) and endpointd's own directories; the home
    directory is untrusted too, but for ``home_allowed`` (the policy's ``program_paths``).
    git, ripgrep and ssh are looked up at once."""
    global _current
    path = os.environ.get("PATH") if path_var is None else path_var
    found = resolve(path, untrusted, home_allowed)
    for name in ("git", "rg", "ssh"):
        found.which(name)
    with _current_lock:
        _current = found
    return found


def configure_for(policy: Policy, *own_directories: Path) -> DaemonPrograms:
    """:func:`configure` from the policy: its allowed roots, writable paths, the tickets'
    workspaces and ``own_directories`` (endpointd's config and state) are untrusted; its
    ``program_paths`` are the home directories allowed."""
    rules = policy.rules
    untrusted: list[Path | str] = [*policy.allowed_roots, policy.workspaces_root]
    untrusted += [*(rules.writable_paths if rules is not None else ()), *own_directories]
    return configure(untrusted, rules.program_paths if rules is not None else ())


def current() -> DaemonPrograms:
    """The programs resolved at the daemon's start; in a process that never configured
    them (the CLI, run by the owner), from its PATH as it is now, with only the home
    directory untrusted."""
    with _current_lock:
        if _current is not None:
            return _current
    return resolve(os.environ.get("PATH"), ())


def which(name: str) -> str | None:
    return current().which(name)


def trusted_path() -> str:
    return current().path
