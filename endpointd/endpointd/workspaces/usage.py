"""How much disk the workspaces take, for the policy's budget (``[workspaces] max_disk_mb``).

:func:`disk_usage` measures a workspace as ``du`` would (allocated blocks, symlinks not
followed, one file system). It walks every file, so the daemon does it in the background
(:meth:`endpointd.workspaces.manager.Workspaces.upkeep`), never on a prepare's path. What a
prepare needs, the size a new workspace will have, is estimated from the clone's index
instead (:func:`index_estimate`): the size of every tracked file, rounded up to whole
blocks, read in milliseconds.
"""

from __future__ import annotations

import os
import stat
import struct

__all__ = ["BLOCK", "disk_usage", "index_estimate"]

BLOCK = 4096
_HEADER = struct.Struct(">4sII")
# ctime, mtime (seconds and nanoseconds), dev, ino, mode, uid, gid, size: ten 32-bit words.
_STAT = struct.Struct(">10I")
_SHA1 = 20
_EXTENDED = 0x4000
_NAME_MASK = 0x0FFF


def disk_usage(path: str) -> int:
    """Bytes allocated beneath ``path`` (0 when it does not exist)."""
    try:
        top = os.lstat(path)
    except OSError:
        return 0
    total = top.st_blocks * 512 if hasattr(top, "st_blocks") else top.st_size
    if not stat.S_ISDIR(top.st_mode):
        return total
    stack = [path]
    while stack:
        directory = stack.pop()
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if info.st_dev != top.st_dev:
                        continue
                    total += info.st_blocks * 512 if hasattr(info, "st_blocks") else info.st_size
                    if stat.S_ISDIR(info.st_mode):
                        stack.append(entry.path)
        except OSError:
            continue
    return total


def _blocks(size: int) -> int:
    return max(BLOCK, -(-size // BLOCK) * BLOCK)


def index_estimate(index_path: str) -> int:
    """The disk a checkout of the files listed in a git index takes (each file rounded up
    to a block); 0 when the index cannot be read (a new clone, a format this does not
    know)."""
    try:
        with open(index_path, "rb") as f:
            data = f.read()
    except OSError:
        return 0
    try:
        return _estimate(data)
    except (struct.error, ValueError, IndexError):
        return 0


def _estimate(data: bytes) -> int:
    signature, version, count = _HEADER.unpack_from(data, 0)
    if signature != b"DIRC" or version not in (2, 3, 4):
        return 0
    pos = _HEADER.size
    total = 0
    for _ in range(count):
        start = pos
        fields = _STAT.unpack_from(data, pos)
        pos += _STAT.size + _SHA1
        (flags,) = struct.unpack_from(">H", data, pos)
        pos += 2
        if version >= 3 and flags & _EXTENDED:
            pos += 2
        if version == 4:
            while data[pos] & 0x80:  # the varint of the prefix to strip
                pos += 1
            pos += 1
            end = data.index(b"\0", pos)
            pos = end + 1
        else:
            length = flags & _NAME_MASK
            end = data.index(b"\0", pos) if length == _NAME_MASK else pos + length
            pos = start + ((end - start + 8) & ~7)
        if stat.S_ISREG(fields[6]):
            total += _blocks(fields[9])
    return total
