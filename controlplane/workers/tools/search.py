"""The worker's finding tools: ``search`` file contents and ``glob`` file names, on the
ticket's device (the ``Search`` and ``Glob`` operations: ripgrep there when it has it, the
same walk and checks either way; see endpointd/endpointd/commands/search.py).

The device is asked for up to :data:`DEVICE_MATCHES` results and the model is shown the
first :data:`SHOWN_MATCHES`: enough to act on, few enough not to drown the context. The
rest stay in the job's output, and the answer says how many there are and the
``recall(id, offset)`` that reads them from the first one not shown. Paths are shown as
the model can pass them back: relative to the working directory when the search was.
"""

from __future__ import annotations

import json
import posixpath
from collections import Counter
from typing import Annotated, Any

from pydantic import Field

from controlplane.gateway import specs
from controlplane.gateway.queue import CommandResult
from controlplane.tools.fields import NON_BLANK, Arguments
from controlplane.workers.tools.core import Call, WorkerTools
from controlplane.workers.tools.fileops import failed, file_op, whole_output

DEVICE_MATCHES = 1000
SHOWN_MATCHES = 100
SHOWN_FILES = 200
SHOWN_CHARS = 16_000  # of matched lines, whatever their number

tools = WorkerTools()

Pattern = Annotated[str, Field(max_length=2000), NON_BLANK]
Where = Annotated[
    str | None,
    Field(
        max_length=4096,
        description="Directory (or file) to look in; default: the working directory.",
    ),
]


def _where(call: Call, path: str | None) -> tuple[str, str]:
    """(the path on the device, the prefix results are shown under)."""
    shown = posixpath.normpath(path) if path else ""
    shown = "" if shown == "." else shown
    return posixpath.normpath(call.bench.path(shown or ".")), shown


def _shown(prefix: str, rel: str) -> str:
    return posixpath.join(prefix, rel) if rel else prefix or "."


def _rest(result: CommandResult, lines: list[bytes], shown: int, unit: str) -> str:
    """What the answer leaves out, and how to read it."""
    left = len(lines) - shown
    offset = sum(len(line) for line in lines[:shown])
    capped = len(lines) >= DEVICE_MATCHES
    more = f"at least {left}" if capped else f"{left}"
    return f"{more} more {unit} not shown: recall(id={result.id!r}, offset={offset}) reads them" + (
        "; the device stopped looking there, so narrow the path, glob or pattern" if capped else ""
    )


class Search(Arguments):
    pattern: Annotated[
        Pattern,
        Field(description="A regular expression (ripgrep syntax), or plain text with literal."),
    ]
    path: Where = None
    glob: Annotated[
        str | None,
        Field(max_length=500, description='Only files matching it: "*.py", "src/**/*.ts".'),
    ] = None
    literal: Annotated[bool | None, Field(description="pattern is plain text.")] = None
    ignore_case: bool | None = None
    files_only: Annotated[
        bool | None, Field(description="List the matching files (with counts), not the lines.")
    ] = None


@tools.tool(
    "search",
    "Search file contents on the device, like ripgrep: each matching line as "
    "path:line: text, capped, with how to read the rest. Skips .gitignored, binary and "
    "hidden-by-policy files. files_only lists matching files instead; glob filters files "
    "by name.",
)
async def search(call: Call, args: Search) -> dict[str, Any]:
    path, prefix = _where(call, args.path)
    spec = specs.Search(
        pattern=args.pattern,
        path=path,
        glob=args.glob or "",
        literal=bool(args.literal),
        ignore_case=bool(args.ignore_case),
        max_matches=DEVICE_MATCHES,
    )
    result = await file_op(call, spec)
    if not result.done:
        return call.bench.pending(result)
    lines = (await whole_output(call, result)).splitlines(keepends=True)
    if not result.ok and not lines:
        return failed(args.path or ".", result)
    matches = [json.loads(line) for line in lines]
    answer: dict[str, Any] = {"matches": len(matches)}
    if args.files_only:
        counts = Counter(_shown(prefix, m["path"]) for m in matches)
        answer["files"] = "\n".join(f"{p} ({n})" for p, n in list(counts.items())[:SHOWN_FILES])
        if len(counts) > SHOWN_FILES:
            answer["more"] = f"{len(counts) - SHOWN_FILES} more files not shown; narrow the search"
        elif len(matches) >= DEVICE_MATCHES:
            answer["more"] = "the device stopped at its limit: there may be more files"
    else:
        shown: list[str] = []
        size = 0
        for m in matches[:SHOWN_MATCHES]:
            row = f"{_shown(prefix, m['path'])}:{m['line']}: {m['text']}"
            size += len(row)
            if shown and size > SHOWN_CHARS:
                break
            shown.append(row)
        answer["results"] = "\n".join(shown)
        if len(shown) < len(matches) or len(matches) >= DEVICE_MATCHES:
            answer["more"] = _rest(result, lines, len(shown), "matches")
    if not matches:
        answer["note"] = "no matches"
    if not result.ok:
        answer["error"] = result.error or result.state
    return answer


class Glob(Arguments):
    pattern: Annotated[
        Pattern,
        Field(description='"**/*.py", "src/*.ts", "README*": without a /, names at any depth.'),
    ]
    path: Where = None


@tools.tool(
    "glob",
    "Find files on the device by name: paths matching the pattern, newest first, capped. "
    "* and ? stay within a directory, ** spans directories; a pattern without / matches "
    "file names at any depth. Skips .gitignored files.",
)
async def glob(call: Call, args: Glob) -> dict[str, Any]:
    path, prefix = _where(call, args.path)
    result = await file_op(call, specs.Glob(args.pattern, path, max_entries=DEVICE_MATCHES))
    if not result.done:
        return call.bench.pending(result)
    lines = (await whole_output(call, result)).splitlines(keepends=True)
    if not result.ok and not lines:
        return failed(args.path or ".", result)
    paths = [_shown(prefix, line.decode().rstrip("\n")) for line in lines]
    answer: dict[str, Any] = {"count": len(paths), "files": "\n".join(paths[:SHOWN_MATCHES])}
    if len(paths) > SHOWN_MATCHES or len(paths) >= DEVICE_MATCHES:
        answer["more"] = _rest(result, lines, min(len(paths), SHOWN_MATCHES), "files")
    if not paths:
        answer["note"] = "no files match"
    if not result.ok:
        answer["error"] = result.error or result.state
    return answer
