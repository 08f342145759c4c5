"""Every directory a git operation of endpointd's resolves to, judged by the policy as the
path itself is.

A clone's ``.git`` may be a *file* (``gitdir: …``), a git dir may name its common dir in
``commondir``, and an object store may borrow another's through
``objects/info/alternates``. A command can write all three, so each is where a prepare
could be led into a repository the owner's policy denies (``~/.password-store``): the
workspace would check that repository out, readable by the ticket's commands.

:func:`judge` takes what git resolved (the git dir and the common dir) and what the object
store is and borrows (alternates, followed as git does, 5 levels deep; each store must hold
no symbolic link, which git never makes there), and refuses with
:class:`WorkspaceError` naming the rule: the git dir and the common dir must lie inside an
allowed root (endpointd writes there: a worktree, a branch) and outside every denied path;
an alternate object store outside every denied path (it is only read). A quoted alternate
line, which this reader does not decode, is refused rather than guessed at.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from endpointd.workspaces.errors import WorkspaceError

__all__ = ["alternates", "judge", "judge_before_git", "local_repository"]

_MAX_DEPTH = 5
_MAX_ALTERNATES = 64


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def alternates(objects: str) -> list[str]:
    """The object stores ``objects`` borrows from, resolved, recursively (as git reads
    ``objects/info/alternates``)."""
    found: list[str] = []
    todo = [(os.path.realpath(objects), 0)]
    while todo:
        store, depth = todo.pop()
        if depth >= _MAX_DEPTH:
            continue
        try:
            with open(os.path.join(store, "info", "alternates"), encoding="utf-8") as f:
                lines = f.read(1 << 16).splitlines()
        except FileNotFoundError:
            continue
        except (OSError, UnicodeDecodeError) as exc:
            raise WorkspaceError(f"cannot read {store}/info/alternates: {exc}") from None
        for line in lines:
            entry = line.strip()
            if not entry or entry.startswith("#"):
                continue
            if entry.startswith('"'):
                raise WorkspaceError(
                    f"{store}/info/alternates has a quoted entry endpointd does not follow"
                )
            real = os.path.realpath(os.path.join(store, entry))
            if real not in found:
                found.append(real)
                todo.append((real, depth + 1))
            if len(found) > _MAX_ALTERNATES:
                raise WorkspaceError(f"{store}/info/alternates names too many object stores")
    return found


def judge(
    git_dir: str,
    common_dir: str,
    *,
    roots: Sequence[str],
    denied_rule: Callable[[str], str | None],
) -> None:
    """Refuse (:class:`WorkspaceError`) a repository whose git dir, common dir or borrowed
    object stores the policy does not allow."""
    real_roots = [os.path.realpath(r) for r in roots]
    for what, path in (("git directory", git_dir), ("common git directory", common_dir)):
        real = os.path.realpath(path)
        rule = denied_rule(path) or denied_rule(real)
        if rule is not None:
            raise WorkspaceError(f"the repository's {what} {real} is under {rule}")
        if not any(_within(real, r) for r in real_roots):
            raise WorkspaceError(
                f"the repository's {what} {real} is outside the allowed roots"
                " (a .git file or commondir leads there)"
            )
    objects = os.path.join(common_dir, "objects")
    for store in [os.path.realpath(objects), *alternates(objects)]:
        rule = denied_rule(store)
        if rule is not None:
            raise WorkspaceError(f"the repository's objects are read from {store}, under {rule}")
        _no_links(store)


def _no_links(store: str) -> None:
    """Refuse an object store holding a symlink (git never makes one there): a loose
    object, pack or index linked into a denied repository would be read through it."""
    subdirs = ["pack", "info", *(f"{i:02x}" for i in range(256))]
    for sub in subdirs:
        try:
            entries = list(os.scandir(os.path.join(store, sub)))
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            raise WorkspaceError(f"cannot list {store}/{sub}: {exc.strerror or exc}") from None
        for entry in entries:
            if entry.is_symlink():
                raise WorkspaceError(
                    f"the object store {store} holds a symbolic link ({sub}/{entry.name}),"
                    " which git never makes"
                )
    for sub in subdirs:
        if os.path.islink(os.path.join(store, sub)):
            raise WorkspaceError(f"the object store {store} holds a symbolic link ({sub})")


def local_repository(path: str, denied_rule: Callable[[str], str | None]) -> None:
    """Refuse a local remote whose ``.git`` file, ``commondir`` or alternates lead into a
    denied path (the remote itself was judged already)."""
    candidates = [path, os.path.join(path, ".git")]
    gitfile = os.path.join(path, ".git")
    if os.path.isfile(gitfile):
        try:
            with open(gitfile, encoding="utf-8") as f:
                text = f.read(4096).strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise WorkspaceError(f"cannot read {gitfile}: {exc}") from None
        target = text.removeprefix("gitdir:").strip()
        candidates.append(os.path.join(path, target))
    for candidate in list(candidates):
        commondir = os.path.join(candidate, "commondir")
        if os.path.isfile(commondir):
            try:
                with open(commondir, encoding="utf-8") as f:
                    candidates.append(os.path.join(candidate, f.read(4096).strip()))
            except (OSError, UnicodeDecodeError) as exc:
                raise WorkspaceError(f"cannot read {commondir}: {exc}") from None
    for candidate in candidates:
        real = os.path.realpath(candidate)
        rule = denied_rule(candidate) or denied_rule(real)
        if rule is not None:
            raise WorkspaceError(f"the remote's repository leads to {real}, under {rule}")
        if os.path.isdir(os.path.join(real, "objects")):
            for store in alternates(os.path.join(real, "objects")):
                rule = denied_rule(store)
                if rule is not None:
                    raise WorkspaceError(
                        f"the remote's repository borrows objects from {store}, under {rule}"
                    )


def _read_pointer(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read(4096).strip()
    except (OSError, UnicodeDecodeError):
        return ""


def judge_before_git(path: str, denied_rule: Callable[[str], str | None]) -> None:
    """Before git looks at ``path``: the ``.git`` of the nearest directory holding one (a
    file's ``gitdir:`` and that dir's ``commondir`` followed) must not lead into a denied
    path. (Confined, git could not read it either, and would call it no repository.)"""
    current = os.path.realpath(path)
    while True:
        dot_git = os.path.join(current, ".git")
        if os.path.lexists(dot_git):
            break
        parent = os.path.dirname(current)
        if parent == current:
            return
        current = parent
    candidates = [dot_git]
    if os.path.isfile(dot_git):
        target = _read_pointer(dot_git).removeprefix("gitdir:").strip()
        if target:
            candidates.append(os.path.join(current, target))
    common = _read_pointer(os.path.join(candidates[-1], "commondir"))
    if common:
        candidates.append(os.path.join(candidates[-1], common))
    for candidate in candidates:
        real = os.path.realpath(candidate)
        rule = denied_rule(candidate) or denied_rule(real)
        if rule is not None:
            raise WorkspaceError(
                f"{path} is a repository whose git directory {real} is under {rule}"
            )
