"""The worker's search operations: ``search`` (file contents) and ``glob`` (file names).

Filled by the worker-toolset work; until then both fail with a clear error.
"""

from __future__ import annotations

from endpointd.commands.fileops import OpResult
from endpointd.guard.files import Checker
from endpointd.model import Glob, Search
from endpointd.spool import SpoolWriter


def run(
    op: Search | Glob,
    out: SpoolWriter,
    *,
    root: str,
    denied: Checker,
    judge: Checker,
    entries: Checker,
    max_output: int | None,
) -> OpResult:
    """Matches (``search``) or paths (``glob``) beneath ``op.path`` on the DATA stream."""
    del out, root, denied, judge, entries, max_output
    return OpResult(1, f"{op.KIND} is not supported by this endpointd yet")
