"""File operations that cannot leave their allowed root: an openat-style walk.

Checking a path string and then opening it is a race: a directory on the way can be
swapped for a symlink in between (TOCTOU), and the open follows it wherever it points. So
:func:`walk` never opens a path string. It opens the allowed root (``O_DIRECTORY |
O_NOFOLLOW``), then every component relative to the directory before it
(``os.open(name, O_NOFOLLOW, dir_fd=parent)``), so each step is bound to the directory it
was taken from.

A component that is a symlink is never followed by the kernel. The walk reads it and
resolves it itself, against the directories it already holds: a link whose target stays
inside the same root is walked again from there (at most :data:`MAX_SYMLINKS` links); a
link leading anywhere else (an absolute target outside the root, or ``..`` above it) is
refused with a one-line message. Directories walked through must not be denied (the
``denied`` checker, normally :meth:`endpointd.guard.policy.Policy.denied_rule`).

Once the target is open, :func:`verify` double-checks where the descriptor really is
(``/proc/self/fd`` on Linux, ``F_GETPATH`` on macOS): inside the root and not refused by
the checker, or it is closed and refused.

Standard library only, and no policy knowledge: callers pass the root and the checkers.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal

# A real, absolute path -> the rule that refuses it, or None.
Checker = Callable[[str], str | None]
# What the walk opens at the end: a file to read, a directory to list, or only the parent
# of the final name (to write it).
Leaf = Literal["file", "dir", "parent"]

MAX_SYMLINKS = 40  # as the kernel's own limit (Linux: 40)

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# A FIFO's open waits for a writer, as any open would (callers that must not wait add
# O_NONBLOCK).
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
# What open(O_NOFOLLOW) says about a symlink: ELOOP (Linux, macOS), EMLINK (FreeBSD), and
# with O_DIRECTORY some systems say ENOTDIR. Each is confirmed with an lstat.
_LINK_ERRNOS = frozenset({errno.ELOOP, errno.EMLINK, errno.ENOTDIR})
_CASE_INSENSITIVE = sys.platform in ("darwin", "win32")
_MAX_MKDIR_RACES = 10


class PathRefused(Exception):
    """The walk will not open this path; the message is one line naming the path and why."""


def fold(path: str) -> str:
    """``path`` as compared: case-folded where the file system ignores case."""
    return path.casefold() if _CASE_INSENSITIVE else path


def within(path: str, root: str) -> bool:
    """Is ``path`` ``root`` or beneath it (both absolute and normalised)?"""
    path, root = fold(path), fold(root)
    if path == root:
        return True
    prefix = root if root.endswith(os.sep) else root + os.sep
    return path.startswith(prefix)


def root_of(path: str, roots: Iterable[str]) -> str | None:
    """The root (of ``roots``, resolved directories) holding ``path``: judged by the path as
    written (normalised) first, else by its resolved form; None if no root holds it."""
    listed = list(roots)
    normal = os.path.normpath(path)
    for root in listed:
        if within(normal, root):
            return root
    real = os.path.realpath(path)
    for root in listed:
        if within(real, root):
            return root
    return None


def _below(path: str, root: str) -> list[str]:
    """The components of ``path`` (within ``root``, both normalised) below ``root``."""
    rest = path[len(root) :]
    return [p for p in rest.split(os.sep) if p and p != "."]


def relative_parts(root: str, path: str) -> list[str]:
    """``path``'s components below ``root``: as written (normalised) if that is inside the
    root, else as resolved now (the walk re-checks every component anyway)."""
    normal = os.path.normpath(path)
    if within(normal, root):
        return _below(normal, root)
    real = os.path.realpath(path)
    if within(real, root):
        return _below(real, root)
    raise PathRefused(f"{path} is outside the allowed root {root}")


def fd_path(fd: int) -> str | None:
    """Where an open descriptor really is, as the kernel says (None if it cannot say)."""
    if sys.platform == "darwin":
        import fcntl

        get_path = getattr(fcntl, "F_GETPATH", None)
        if get_path is None:
            return None
        try:
            raw = fcntl.fcntl(fd, get_path, bytes(1024))  # MAXPATHLEN
        except OSError:
            return None
        return os.fsdecode(raw.split(b"\0", 1)[0]) or None
    try:
        found = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    return found if found.startswith("/") else None


@dataclass
class Opened:
    """The result of a :func:`walk`; every descriptor is the walk's (closed when it ends).

    ``dir_fd`` is the directory holding the target, ``dir_path`` its path as walked;
    ``name`` the target's name in it ("" when the target is that directory itself); ``fd``
    the target, opened (leaf "file" or "dir"), or None (leaf "parent").
    """

    root: str
    display: str
    root_fd: int
    names: list[str] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)
    name: str = ""
    fd: int | None = None

    @property
    def dir_fd(self) -> int:
        return self.fds[-1] if self.fds else self.root_fd

    @property
    def dir_path(self) -> str:
        return os.path.join(self.root, *self.names)

    def where(self, name: str) -> str:
        return os.path.join(self.dir_path, name)

    def push(self, name: str, fd: int) -> None:
        self.names.append(name)
        self.fds.append(fd)

    def pop(self) -> None:
        self.names.pop()
        os.close(self.fds.pop())

    def back_to_root(self) -> None:
        while self.fds:
            self.pop()

    def close(self) -> None:
        if self.fd is not None and self.fd != self.dir_fd:
            os.close(self.fd)
        self.fd = None
        self.back_to_root()
        os.close(self.root_fd)


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


class _Walker:
    def __init__(self, opened: Opened, denied: Checker, create_parents: bool) -> None:
        self.o = opened
        self.denied = denied
        self.create_parents = create_parents
        self.hops = 0
        self.note = ""  # the last symlink followed, for messages

    def refuse_out(self) -> PathRefused:
        return PathRefused(
            f"{self.o.display}: {self.note or 'the path'}, which leads out of the allowed root"
            f" {self.o.root}; file operations do not follow links out of the root"
        )

    def follow(self, name: str, pending: list[str]) -> None:
        """``name`` (in the current directory) is a symlink: continue with its target."""
        o = self.o
        target = os.readlink(name, dir_fd=o.dir_fd)
        self.hops += 1
        link = o.where(name)
        if self.hops > MAX_SYMLINKS:
            raise PathRefused(
                f"{o.display}: more than {MAX_SYMLINKS} symbolic links on the way (the last"
                f" {link}); file operations stop there"
            )
        self.note = f"{link} is a symlink to {target}"
        if not target:
            raise PathRefused(f"{o.display}: {link} is an empty symlink")
        if os.path.isabs(target):
            resolved = os.path.normpath(target)
            if not within(resolved, o.root):
                # The owner may write links through a symlinked prefix of the root (/tmp
                # on macOS is /private/tmp); every component is walked again regardless.
                resolved = os.path.realpath(resolved)
                if not within(resolved, o.root):
                    raise PathRefused(
                        f"{o.display}: {link} is a symlink to {target}, outside the allowed"
                        f" root {o.root}; file operations do not follow links out of the root"
                    )
            o.back_to_root()
            parts = _below(resolved, o.root)
        else:
            parts = [p for p in target.split("/") if p and p != "."]
        pending.extend(reversed(parts))

    def check_dir(self) -> None:
        """The directory the walk is in must not be denied (before creating in it)."""
        o = self.o
        where = fd_path(o.dir_fd) or o.dir_path
        if not within(where, o.root):
            raise PathRefused(f"{o.display}: {where} is outside the allowed root {o.root}")
        rule = self.denied(where)
        if rule is not None:
            raise PathRefused(f"{o.display}: {where} is refused ({rule})")

    def run(self, parts: list[str], leaf: Leaf) -> None:
        o = self.o
        pending = list(reversed(parts))  # a stack: pop() is the next component
        mkdir_races = 0
        while pending:
            name = pending.pop()
            if name == "..":
                if not o.fds:
                    raise self.refuse_out()
                o.pop()
                continue
            last = not pending
            if last and leaf == "parent":
                try:
                    st = os.stat(name, dir_fd=o.dir_fd, follow_symlinks=False)
                except FileNotFoundError:
                    o.name = name
                    return
                if stat.S_ISLNK(st.st_mode):
                    self.follow(name, pending)
                    continue
                o.name = name
                return
            as_dir = not last or leaf == "dir"
            try:
                fd = os.open(name, DIR_FLAGS if as_dir else FILE_FLAGS, dir_fd=o.dir_fd)
            except FileNotFoundError:
                if last or not self.create_parents or mkdir_races > _MAX_MKDIR_RACES:
                    raise
                self.check_dir()
                with contextlib.suppress(FileExistsError):  # made meanwhile: fine
                    os.mkdir(name, 0o777, dir_fd=o.dir_fd)
                mkdir_races += 1
                pending.append(name)
                continue
            except OSError as exc:
                if exc.errno in _LINK_ERRNOS and _is_link(name, o.dir_fd):
                    self.follow(name, pending)
                    continue
                raise
            if last:
                o.name, o.fd = name, fd
                return
            o.push(name, fd)
            rule = self.denied(o.dir_path)
            if rule is not None:
                raise PathRefused(f"{o.display}: {o.dir_path} is refused ({rule})")
        # No name left: the target is the directory the walk ended in (the root itself, or
        # a link to a directory).
        if leaf == "parent":
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), o.display)
        if leaf == "dir":
            o.fd = o.dir_fd
        else:
            # Reading a directory: let read() say EISDIR, as it would for any directory.
            o.fd = os.dup(o.dir_fd)


@contextlib.contextmanager
def walk(
    root: str,
    path: str,
    *,
    leaf: Leaf,
    denied: Checker,
    create_parents: bool = False,
) -> Iterator[Opened]:
    """Open ``path`` (absolute, inside ``root``, a resolved directory) without ever letting
    the kernel follow a symlink; see the module docstring.

    Raises PathRefused (one line, naming the path) for a way out of the root or a denied
    directory on the way, and OSError as an open would (missing, not a directory, ...).
    ``create_parents`` (leaf "parent") makes missing directories one at a time with
    ``mkdir(name, dir_fd=parent)``.
    """
    parts = relative_parts(root, path)
    try:
        root_fd = os.open(root, DIR_FLAGS)
    except OSError as exc:
        if exc.errno in _LINK_ERRNOS:
            raise PathRefused(
                f"the allowed root {root} is no longer a directory (a symlink now?);"
                " file operations under it are refused"
            ) from None
        raise
    opened = Opened(root=root, display=path, root_fd=root_fd)
    try:
        _Walker(opened, denied, create_parents).run(parts, leaf)
        yield opened
    finally:
        opened.close()


def verify(opened: Opened, fd: int, checker: Checker, name: str = "") -> str:
    """Where ``fd`` (``name`` in it, if given) really is; PathRefused unless that is inside
    the root and ``checker`` refuses nothing. Returns the real path."""
    where = fd_path(fd)
    if where is None:
        # No /proc and no F_GETPATH: the walk's own path, exact by construction.
        where = opened.dir_path if fd == opened.dir_fd else opened.where(opened.name)
    if name:
        where = os.path.join(where, name)
    shown = opened.display
    resolved = "" if os.path.normpath(shown) == where else f" (it resolves to {where})"
    if not within(where, opened.root):
        raise PathRefused(f"{shown}{resolved} is outside the allowed root {opened.root}")
    rule = checker(where)
    if rule is not None:
        raise PathRefused(f"{shown}{resolved} is refused ({rule})")
    return where


def cap_mode(mode: int) -> int:
    """A file mode endpointd will create: no group or world write, no setuid, setgid or
    sticky bit; read and execute bits are kept."""
    return mode & 0o777 & ~0o022
