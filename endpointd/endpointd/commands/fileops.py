"""The file operations: read_file, write_file, list_dir.

Each runs synchronously (the daemon calls it in a worker thread), writes any payload to the
command's spool on the DATA stream, and returns an :class:`OpResult`; the daemon turns that
into Finished. Paths were checked to be absolute by validation and judged by the policy
(allowed roots, denied paths, ``[[files]]`` rules) before the operation starts.

What this module adds is that the check cannot be raced: every path is opened through
:func:`endpointd.guard.files.walk`, from the allowed root ``root`` (the resolved root that
holds the path) one component at a time, never letting the kernel follow a symlink. A
symlink on the way is followed only while it stays inside the same root; one leading out
is refused. The opened descriptor's real location is checked again (``judge``, by default
``denied``) before a byte is read or written, and no directory on the way may be
``denied``. Errors are one line naming the path (and the rule), never a traceback.

Modes are capped: a file written gets ``op.mode`` (or the replaced file's mode, or 0644)
without group/world write and without setuid, setgid or sticky bits (``mode & 0o755``),
silently.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from endpointd.guard import files
from endpointd.guard.files import Checker, PathRefused
from endpointd.spool import STREAM_DATA, SpoolWriter
from superagent_shared.messages import ListDir, ReadFile, WriteFile

# Until the policy file sets one: the most a single read_file returns.
MAX_READ_BYTES = 64 * 1024 * 1024
_READ_PIECE = 64 * 1024
_TEMP_FLAGS = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
_TEMP_TRIES = 100


@dataclass(frozen=True)
class OpResult:
    exit_code: int = 0
    error: str = ""
    truncated: bool = False  # stopped at the operation's own cap (Finished.output_truncated)


def _failure(message: str) -> OpResult:
    return OpResult(exit_code=1, error=message)


def _os_error(action: str, path: str, exc: OSError) -> OpResult:
    if isinstance(exc, FileNotFoundError):
        return _failure(f"no such file or directory: {path}")
    if isinstance(exc, PermissionError):
        return _failure(f"permission denied {action} {path}")
    if isinstance(exc, IsADirectoryError):
        return _failure(f"is a directory: {path}")
    if isinstance(exc, NotADirectoryError):
        return _failure(f"not a directory: {path}")
    return _failure(f"error {action} {path}: {exc.strerror or exc}")


def read_file(
    op: ReadFile,
    out: SpoolWriter,
    *,
    root: str,
    denied: Checker,
    judge: Checker | None = None,
) -> OpResult:
    """Read ``op.path`` (inside ``root``) into ``out``: ``op.offset``, at most ``op.limit``."""
    limit = min(op.limit, MAX_READ_BYTES) if op.limit is not None else MAX_READ_BYTES
    try:
        with files.walk(root, op.path, leaf="file", denied=denied) as opened:
            assert opened.fd is not None
            fd = opened.fd
            files.verify(opened, fd, judge or denied)
            if op.offset:
                _skip(fd, op.offset)
            remaining = limit
            while remaining > 0:
                piece = os.read(fd, min(_READ_PIECE, remaining))
                if not piece:
                    break
                out.append(STREAM_DATA, piece)
                remaining -= len(piece)
    except PathRefused as exc:
        return _failure(str(exc))
    except OSError as exc:
        return _os_error("reading", op.path, exc)
    return OpResult()


def _skip(fd: int, offset: int) -> None:
    try:
        os.lseek(fd, offset, os.SEEK_SET)
    except OSError:
        # Pipes and character devices cannot seek; reading past the prefix is equivalent.
        while offset > 0:
            piece = os.read(fd, min(_READ_PIECE, offset))
            if not piece:
                break
            offset -= len(piece)


def write_file(
    op: WriteFile,
    *,
    root: str,
    denied: Checker,
    judge: Checker | None = None,
) -> OpResult:
    """Write ``op.content`` to ``op.path`` (inside ``root``) atomically: a temp file in the
    same directory, then rename (or link, for a no-clobber create).

    The mode is ``op.mode``, else the replaced file's, else 0644, always capped by
    :func:`endpointd.guard.files.cap_mode` (no group/world write, no setuid/setgid/sticky).
    A final symlink is followed only inside the root; the file replaced is its target.
    """
    parent = os.path.dirname(op.path)
    try:
        with files.walk(
            root, op.path, leaf="parent", denied=denied, create_parents=op.create_parents
        ) as opened:
            files.verify(opened, opened.dir_fd, judge or denied, opened.name)
            return _write_in(opened.dir_fd, opened.name, op)
    except PathRefused as exc:
        return _failure(str(exc))
    except FileNotFoundError as exc:
        if not op.create_parents:
            return _failure(f"parent directory does not exist: {parent} (set create_parents)")
        return _os_error("creating", parent, exc)
    except OSError as exc:
        return _os_error("writing", op.path, exc)


def _write_in(dir_fd: int, name: str, op: WriteFile) -> OpResult:
    target = op.path
    must_not_exist = op.expected_sha256 is not None and len(op.expected_sha256) == 0
    existing_mode: int | None = None
    current: bytes | None = None
    try:
        # O_NONBLOCK: a FIFO in the way must not hang the worker thread.
        fd = os.open(name, files.FILE_FLAGS | os.O_NONBLOCK, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):
            # The walk resolved this name; a symlink put there since is not followed.
            return _failure(f"{target} is a symlink; file operations do not follow links")
        return _os_error("inspecting", target, exc)
    else:
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                return _failure(f"is a directory: {target}")
            existing_mode = stat.S_IMODE(st.st_mode)
            if op.expected_sha256 is not None and not must_not_exist:
                current = _sha256(fd) if stat.S_ISREG(st.st_mode) else b""
        except OSError as exc:
            return _os_error("reading", target, exc)
        finally:
            os.close(fd)

    if op.expected_sha256 is not None and not must_not_exist:
        if existing_mode is None:
            return _failure(f"expected_sha256 mismatch: {target} does not exist")
        if current != op.expected_sha256:
            shown = current.hex() if current else "(not a regular file)"
            return _failure(
                f"expected_sha256 mismatch: {target} has sha256 {shown}, expected"
                f" {op.expected_sha256.hex()} (changed concurrently?)"
            )
    elif must_not_exist and existing_mode is not None:
        return _failure(f"expected_sha256 mismatch: {target} already exists")

    wanted = op.mode if op.mode is not None else existing_mode
    mode = files.cap_mode(0o644 if wanted is None else wanted)
    try:
        fd, tmp = _create_temp(dir_fd, name)
    except OSError as exc:
        return _os_error("writing in", os.path.dirname(target), exc)
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(op.content)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        if must_not_exist:
            # link() fails if the name exists: a no-clobber create with no check-then-act race.
            try:
                os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except FileExistsError:
                return _failure(f"expected_sha256 mismatch: {target} already exists")
        else:
            # rename() replaces the name itself: were a symlink swapped in meanwhile, the link
            # is replaced, never followed.
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        os.fsync(dir_fd)
    except OSError as exc:
        return _os_error("writing", target, exc)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)
    return OpResult()


def _sha256(fd: int) -> bytes:
    digest = hashlib.sha256()
    while piece := os.read(fd, _READ_PIECE):
        digest.update(piece)
    return digest.digest()


def _create_temp(dir_fd: int, name: str) -> tuple[int, str]:
    """A new, empty 0600 file beside ``name`` in ``dir_fd``: (fd, its name)."""
    for _ in range(_TEMP_TRIES):
        tmp = f".{name[:100]}.{os.urandom(6).hex()}.endpointd"
        try:
            return os.open(tmp, _TEMP_FLAGS, 0o600, dir_fd=dir_fd), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no usable temporary file name", name)


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    return "other"


def _either(first: Checker, second: Checker) -> Checker:
    def either(real: str) -> str | None:
        return first(real) or second(real)

    return either


class _Lister:
    """The entries beneath one directory descriptor, never leaving the root."""

    def __init__(self, root: str, refused: Checker) -> None:
        self.root = root
        self.check = refused

    def refused(self, real: str) -> bool:
        return self.check(real) is not None

    def entries(
        self, dir_fd: int, dir_real: str, rel: str, levels: int
    ) -> Iterator[dict[str, object]]:
        with os.scandir(dir_fd) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            path = f"{rel}/{entry.name}" if rel else entry.name
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # vanished while listing
            real = os.path.join(dir_real, entry.name)
            if stat.S_ISLNK(st.st_mode) and not files.within(os.path.realpath(real), self.root):
                continue  # a link out of the root: not even its name
            if self.refused(real):
                # Its name, so the listing is honest about what is there; nothing else.
                yield {"path": path, "type": _kind(st.st_mode), "denied": True}
                continue
            yield {
                "path": path,
                "type": _kind(st.st_mode),
                "size": st.st_size,
                "mode": stat.S_IMODE(st.st_mode),
                "mtime": st.st_mtime,
            }
            if levels > 1 and stat.S_ISDIR(st.st_mode):
                with contextlib.suppress(OSError):  # unreadable subdirectory: list what we can
                    yield from self.subdirectory(dir_fd, entry.name, real, path, levels - 1)

    def subdirectory(
        self, dir_fd: int, name: str, real: str, rel: str, levels: int
    ) -> Iterator[dict[str, object]]:
        # By name in the descriptor just listed, never following a link swapped in for it.
        sub = os.open(name, files.DIR_FLAGS, dir_fd=dir_fd)
        try:
            where = files.fd_path(sub) or real
            if not files.within(where, self.root) or self.refused(where):
                return
            yield from self.entries(sub, where, rel, levels)
        finally:
            os.close(sub)


def list_dir(
    op: ListDir,
    out: SpoolWriter,
    *,
    root: str,
    denied: Checker,
    judge: Checker | None = None,
    entries: Checker | None = None,
) -> OpResult:
    """JSON lines, one per entry beneath ``op.path`` (``op.depth`` levels, at least 1).

    The directory itself must pass ``judge`` (default ``denied``); each entry and each
    subdirectory descended into must pass ``entries``, which must refuse what ``denied``
    refuses (default: ``denied``, then ``judge``).
    Symlinks are listed as symlinks and never followed; one whose target leaves ``root`` is
    left out. A refused entry is listed by name and type only, with ``"denied": true``,
    and never descended into.
    """
    check = judge or denied
    batch = bytearray()
    try:
        with files.walk(root, op.path, leaf="dir", denied=denied) as opened:
            assert opened.fd is not None
            real = files.verify(opened, opened.fd, check)
            lister = _Lister(root, entries if entries is not None else _either(denied, check))
            for item in lister.entries(opened.fd, real, "", max(op.depth, 1)):
                batch += json.dumps(item, ensure_ascii=False).encode("utf-8") + b"\n"
                if len(batch) >= _READ_PIECE:
                    out.append(STREAM_DATA, bytes(batch))
                    batch.clear()
    except PathRefused as exc:
        return _failure(str(exc))
    except FileNotFoundError:
        return _failure(f"no such directory: {op.path}")
    except NotADirectoryError:
        return _failure(f"not a directory: {op.path}")
    except OSError as exc:
        return _os_error("listing", op.path, exc)
    if batch:
        out.append(STREAM_DATA, bytes(batch))
    return OpResult()
