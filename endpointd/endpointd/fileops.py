"""The file operations: read_file, write_file, list_dir.

Each runs synchronously (the daemon calls it in a worker thread), writes any payload to the
command's spool on the DATA stream, and returns an :class:`OpResult`; the daemon turns that
into Finished. Paths were checked to be absolute by validation; the allowed-roots check is
the policy hook's job, not this module's.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from endpointd.fsutil import fsync_dir
from endpointd.spool import STREAM_DATA, SpoolWriter
from superagent_proto.v1 import endpoint_pb2

# Until the policy file sets one: the most a single read_file returns.
MAX_READ_BYTES = 64 * 1024 * 1024
_READ_PIECE = 64 * 1024


@dataclass(frozen=True)
class OpResult:
    exit_code: int = 0
    error: str = ""


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


def read_file(op: endpoint_pb2.ReadFile, out: SpoolWriter) -> OpResult:
    limit = min(op.limit, MAX_READ_BYTES) if op.HasField("limit") else MAX_READ_BYTES
    try:
        with open(op.path, "rb") as f:
            if op.offset:
                _skip(f, op.offset)
            remaining = limit
            while remaining > 0:
                piece = f.read(min(_READ_PIECE, remaining))
                if not piece:
                    break
                out.append(STREAM_DATA, piece)
                remaining -= len(piece)
    except OSError as exc:
        return _os_error("reading", op.path, exc)
    return OpResult()


def _skip(f: BinaryIO, offset: int) -> None:
    try:
        f.seek(offset)
    except (OSError, ValueError):
        # Pipes and character devices cannot seek; reading past the prefix is equivalent.
        while offset > 0:
            piece = f.read(min(_READ_PIECE, offset))
            if not piece:
                break
            offset -= len(piece)


def write_file(op: endpoint_pb2.WriteFile) -> OpResult:
    target = Path(op.path)
    parent = target.parent
    if not parent.is_dir():
        if not op.create_parents:
            return _failure(f"parent directory does not exist: {parent} (set create_parents)")
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return _os_error("creating", str(parent), exc)

    must_not_exist = op.HasField("expected_sha256") and len(op.expected_sha256) == 0
    existing_mode: int | None = None
    try:
        st = os.stat(target)
        if stat.S_ISDIR(st.st_mode):
            return _failure(f"is a directory: {target}")
        existing_mode = stat.S_IMODE(st.st_mode)
    except FileNotFoundError:
        pass
    except OSError as exc:
        return _os_error("inspecting", op.path, exc)

    if op.HasField("expected_sha256") and not must_not_exist:
        try:
            current = hashlib.sha256(target.read_bytes()).digest()
        except FileNotFoundError:
            return _failure(f"expected_sha256 mismatch: {target} does not exist")
        except OSError as exc:
            return _os_error("reading", op.path, exc)
        if current != op.expected_sha256:
            return _failure(
                f"expected_sha256 mismatch: {target} has sha256 {current.hex()}, expected"
                f" {op.expected_sha256.hex()} (changed concurrently?)"
            )
    elif must_not_exist and existing_mode is not None:
        return _failure(f"expected_sha256 mismatch: {target} already exists")

    mode = (
        op.mode if op.HasField("mode") else (existing_mode if existing_mode is not None else 0o644)
    )
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".endpointd", dir=parent)
    except OSError as exc:
        return _os_error("writing in", str(parent), exc)
    try:
        try:
            os.fchmod(fd, mode & 0o7777)
            view = memoryview(op.content)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        if must_not_exist:
            # link() fails if the name exists: a no-clobber create with no check-then-act race.
            try:
                os.link(tmp, target)
            except FileExistsError:
                return _failure(f"expected_sha256 mismatch: {target} already exists")
        else:
            os.replace(tmp, target)
        fsync_dir(parent)
    except OSError as exc:
        return _os_error("writing", op.path, exc)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return OpResult()


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    return "other"


def _walk(root: Path, rel: str, levels: int) -> Iterator[dict[str, object]]:
    base = root / rel if rel else root
    with os.scandir(base) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        path = f"{rel}/{entry.name}" if rel else entry.name
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue  # vanished while listing
        yield {
            "path": path,
            "type": _kind(st.st_mode),
            "size": st.st_size,
            "mode": stat.S_IMODE(st.st_mode),
            "mtime": st.st_mtime,
        }
        if levels > 1 and stat.S_ISDIR(st.st_mode):
            with contextlib.suppress(OSError):  # unreadable subdirectory: list what we can
                yield from _walk(root, path, levels - 1)


def list_dir(op: endpoint_pb2.ListDir, out: SpoolWriter) -> OpResult:
    root = Path(op.path)
    if not root.is_dir():
        return _failure(
            f"not a directory: {root}" if root.exists() else f"no such directory: {root}"
        )
    batch = bytearray()
    try:
        for item in _walk(root, "", max(op.depth, 1)):
            batch += json.dumps(item, ensure_ascii=False).encode("utf-8") + b"\n"
            if len(batch) >= _READ_PIECE:
                out.append(STREAM_DATA, bytes(batch))
                batch.clear()
    except OSError as exc:
        return _os_error("listing", op.path, exc)
    if batch:
        out.append(STREAM_DATA, bytes(batch))
    return OpResult()
