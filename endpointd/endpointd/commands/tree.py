"""The files beneath a directory, as a search or a glob may see them.

A search reads many files it was never named, so each one gets the treatment a
``read_file`` of its own would (:mod:`endpointd.commands.fileops`): the start is opened with
:func:`endpointd.guard.files.walk` and judged on where it really is; every directory below
is opened by name relative to the one holding it (``O_NOFOLLOW``), checked again where the
kernel says it is (inside the root, not ``denied``, not refused by ``entries``), and only
then listed; every file is judged by ``entries`` before anything uses its name, and a file
to be read is opened the same way and judged again on its descriptor (``judge``). A
symlink is never followed, listed or read: a link into a denied path or out of the root is
not a way in, whatever it points at, and the check is on descriptors, never on strings a
racing process could change between the check and the use.

Skipped besides: ``.git`` (and ``.hg``, ``.svn``) directories, what ``.gitignore`` files
ignore (:mod:`endpointd.commands.globs`; the ones in the searched directory, below it, and
above it up to the repository's top or the allowed root), and anything not a regular file.
Hidden files are searched, as ``rg --hidden`` would.

Standard library only; no policy knowledge (the caller passes the checkers).
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from endpointd.commands.globs import IgnoreFile, Ignores
from endpointd.guard import files
from endpointd.guard.files import Checker, PathRefused

SKIPPED_DIRS = frozenset({".git", ".hg", ".svn"})
MAX_IGNORE_BYTES = 1 << 20  # a .gitignore larger than this is read only this far


@dataclass(frozen=True)
class Candidate:
    """A regular file the walk found: its name in ``dir_fd`` (valid until the walk moves
    on), its path relative to the searched directory, and its ``lstat``."""

    rel: str
    name: str
    dir_fd: int
    real: str
    size: int
    mtime: float


@dataclass(frozen=True)
class Checkers:
    """What may be walked through (``denied``), named (``entries``) and read (``judge``)."""

    denied: Checker
    judge: Checker
    entries: Checker

    def refuses_entry(self, real: str) -> bool:
        return self.denied(real) is not None or self.entries(real) is not None


def open_checked(found: Candidate, root: str, judge: Checker) -> int | None:
    """``found`` opened for reading, checked where it really is; None if it changed since
    it was listed (now a link, a directory, a FIFO, gone) or what it is now is refused."""
    try:
        # O_NONBLOCK: a FIFO swapped in must not hang the walk.
        fd = os.open(found.name, files.FILE_FLAGS | os.O_NONBLOCK, dir_fd=found.dir_fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise PathRefused("not a regular file")
        where = files.fd_path(fd) or found.real
        if not files.within(where, root) or judge(where) is not None:
            raise PathRefused(f"{where} is refused")
    except (OSError, PathRefused):
        os.close(fd)
        return None
    return fd


def _read_ignore(dir_fd: int, dir_real: str, root: str, judge: Checker) -> IgnoreFile | None:
    """The directory's ``.gitignore``, read as any file is (None: none, or not readable)."""
    found = Candidate(".gitignore", ".gitignore", dir_fd, f"{dir_real}/.gitignore", 0, 0.0)
    fd = open_checked(found, root, judge)
    if fd is None:
        return None
    try:
        data = os.read(fd, MAX_IGNORE_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
    return IgnoreFile.parse(dir_real, data.decode("utf-8", errors="replace"))


def _has_git(dir_fd: int) -> bool:
    try:
        os.stat(".git", dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    return True


def _ancestor_ignores(root: str, start: str, start_fd: int, checks: Checkers) -> Ignores:
    """The ``.gitignore`` files above ``start`` (inside ``root``) that apply to it: up to the
    nearest directory holding ``.git`` (the repository's top), else up to the root."""
    found: list[IgnoreFile] = []
    top = _has_git(start_fd)
    current = start
    while not top and current != root and files.within(current, root):
        current = os.path.dirname(current)
        try:
            with files.walk(root, current, leaf="dir", denied=checks.denied) as opened:
                assert opened.fd is not None
                real = files.verify(opened, opened.fd, checks.entries)
                ignore = _read_ignore(opened.fd, real, root, checks.judge)
                top = _has_git(opened.fd)
        except (OSError, PathRefused):
            break
        if ignore is not None:
            found.append(ignore)
    return Ignores(tuple(reversed(found)))


class Walk:
    """Every regular file beneath one directory, in path order (each directory's entries
    sorted by name), as ``rg --sort path`` lists them (see the module doc)."""

    def __init__(self, root: str, checks: Checkers) -> None:
        self.root = root
        self.checks = checks

    def candidates(
        self, dir_fd: int, dir_real: str, rel: str, ignores: Ignores
    ) -> Iterator[Candidate]:
        ignores = ignores.with_file(_read_ignore(dir_fd, dir_real, self.root, self.checks.judge))
        with os.scandir(dir_fd) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # vanished meanwhile
            real = f"{dir_real.rstrip('/')}/{entry.name}"
            path = f"{rel}/{entry.name}" if rel else entry.name
            is_dir = stat.S_ISDIR(st.st_mode)
            if not (is_dir or stat.S_ISREG(st.st_mode)):
                continue  # symlinks, sockets, FIFOs, devices: never followed nor read
            if is_dir and entry.name in SKIPPED_DIRS:
                continue
            if ignores.ignored(real, is_dir) or self.checks.refuses_entry(real):
                continue
            if is_dir:
                with contextlib.suppress(OSError):  # unreadable, or replaced: skip it
                    yield from self._subdirectory(dir_fd, entry.name, real, path, ignores)
            else:
                yield Candidate(path, entry.name, dir_fd, real, st.st_size, st.st_mtime)

    def _subdirectory(
        self, dir_fd: int, name: str, real: str, rel: str, ignores: Ignores
    ) -> Iterator[Candidate]:
        # By name in the directory just listed: a link swapped in for it is not followed.
        sub = os.open(name, files.DIR_FLAGS, dir_fd=dir_fd)
        try:
            where = files.fd_path(sub) or real
            if not files.within(where, self.root) or self.checks.refuses_entry(where):
                return
            yield from self.candidates(sub, where, rel, ignores)
        finally:
            os.close(sub)


def walk_files(root: str, path: str, checks: Checkers, *, allow_file: bool) -> Iterator[Candidate]:
    """The regular files beneath ``path`` (or, with ``allow_file``, ``path`` itself, a file,
    whose path in the answer is ``""``), not ignored and not refused. Raises PathRefused or
    OSError (as :func:`endpointd.guard.files.walk` does) for ``path`` itself."""
    try:
        with files.walk(root, path, leaf="dir", denied=checks.denied) as opened:
            assert opened.fd is not None
            real = files.verify(opened, opened.fd, checks.judge)
            ignores = _ancestor_ignores(root, real, opened.fd, checks)
            yield from Walk(root, checks).candidates(opened.fd, real, "", ignores)
            return
    except NotADirectoryError:
        if not allow_file:
            raise
    with files.walk(root, path, leaf="parent", denied=checks.denied) as opened:
        real = files.verify(opened, opened.dir_fd, checks.judge, opened.name)
        st = os.stat(opened.name, dir_fd=opened.dir_fd, follow_symlinks=False)
        if stat.S_ISREG(st.st_mode):
            yield Candidate("", opened.name, opened.dir_fd, real, st.st_size, st.st_mtime)
