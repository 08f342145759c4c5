"""The C library through ctypes, loaded once per process, and its error convention.

The kernel interfaces the sandbox uses (``mount``, ``unshare``, ``setns``, ``prctl``,
``capset``, raw system calls) have no Python wrapper. Standard library only: the
supervisor and a namespace's init import this in a bare interpreter.
"""

from __future__ import annotations

import ctypes
import os

_loaded: ctypes.CDLL | None = None


def libc() -> ctypes.CDLL:
    """The C library, with ``errno`` kept for :func:`check`."""
    global _loaded
    if _loaded is None:
        _loaded = ctypes.CDLL(None, use_errno=True)
    return _loaded


def check(result: int, what: str) -> int:
    """``result`` when the call succeeded (not negative); else :class:`OSError` with the
    call's errno, saying ``what`` failed."""
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result
