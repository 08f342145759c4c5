"""The worker's file tools: ``view`` a window of numbered lines, ``edit`` by exact
replacement, ``create_file`` that never clobbers.

Shaped after what the anchors learned (docs/workers.md, "Why the file tools look like
this"): a window of numbered lines rather than a whole file; an edit that names the text
it replaces and is refused, with nothing written, when that text is missing or ambiguous;
feedback at once (the lines around the change). The device reads and writes; the
numbering and the matching happen here. An edit writes compare-and-swap
(``WriteFile.expected_sha256`` of exactly what it read), so a file changed meanwhile, by a
command or a person, is refused rather than overwritten.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field

from controlplane.gateway import specs
from controlplane.tools.fields import NON_BLANK, Arguments
from controlplane.tools.registry import Refused
from controlplane.workers.tools import numbered
from controlplane.workers.tools.core import Call, WorkerTools
from controlplane.workers.tools.fileops import failed, file_op, whole_output

VIEW_LINES = 200  # the default window
MAX_VIEW_LINES = 2000
FIRST_READ = 256 * 1024  # most source files are read whole in one go
MAX_VIEW_BYTES = 16 * 1024 * 1024  # view reads no further into a file than this
MAX_EDIT_BYTES = 5_000_000
BINARY_SNIFF = 8000  # git's rule: a NUL in the first 8000 bytes makes a file binary

tools = WorkerTools()

FilePath = Annotated[str, Field(max_length=4096), NON_BLANK]
LineNumber = Annotated[int | None, Field(ge=-(1 << 31), le=1 << 31)]
Text = Annotated[str, Field(max_length=MAX_EDIT_BYTES)]


@dataclass(frozen=True)
class _Read:
    data: bytes
    complete: bool  # the end of the file was reached


async def _read(
    call: Call, path: str, want_lines: int, most: int, first: int = FIRST_READ
) -> _Read | dict[str, Any]:
    """The file from its start until it holds ``want_lines`` whole lines, its end, or
    more than ``most`` bytes, in reads of ``first`` bytes, then twice as many each time
    (a long file is not read whole to show its top); a dict: what to answer instead (a
    failure, or still pending)."""
    data, piece = b"", first
    while True:
        piece = min(piece, most + 1 - len(data))
        result = await file_op(call, specs.ReadFile(path, len(data), piece))
        if not result.done:
            return call.bench.pending(result)
        if not result.ok:
            return failed(path, result)
        chunk = await whole_output(call, result)
        data += chunk
        if len(chunk) < piece:
            return _Read(data, complete=True)
        if data.count(b"\n") >= want_lines or len(data) > most:
            return _Read(data, complete=False)
        piece *= 2


class View(Arguments):
    path: FilePath
    start_line: Annotated[
        LineNumber, Field(description="First line to show (1-based); default 1.")
    ] = None
    end_line: Annotated[
        LineNumber,
        Field(description=f"Last line to show, inclusive; default start_line + {VIEW_LINES - 1}."),
    ] = None


@tools.tool(
    "view",
    f"Show a text file on the device as numbered lines (cat -n: number, tab, line), "
    f"{VIEW_LINES} lines from start_line by default, at most {MAX_VIEW_LINES}. Says how many "
    "lines the file has and how to see more. Relative paths start at the working directory. "
    "To edit, copy the text after the tab exactly.",
)
async def view(call: Call, args: View) -> dict[str, Any]:
    path = call.bench.path(args.path)
    first = max(args.start_line or 1, 1)
    wanted = args.end_line if args.end_line is not None else first + VIEW_LINES - 1
    last = min(max(wanted, first), first + MAX_VIEW_LINES)
    read = await _read(call, path, last + 1, MAX_VIEW_BYTES)
    if not isinstance(read, _Read):
        return read
    data = read.data
    if b"\0" in data[:BINARY_SNIFF]:
        raise Refused(f"{args.path} is a binary file; view shows text (use shell to inspect it)")
    if not read.complete:
        data = data[: data.rfind(b"\n") + 1]  # whole lines only
    text = data.decode("utf-8", errors="replace")
    lines = numbered.lines_of(text)
    total = len(lines)
    window = numbered.window(total, args.start_line, args.end_line, VIEW_LINES, MAX_VIEW_LINES)
    of = f"{total}" if read.complete else f"at least {total} (the file is long)"
    answer: dict[str, Any] = {"path": args.path}
    notes = [window.note] if window.note else []
    if total == 0:
        answer["lines"] = "none: the file is empty"
    else:
        answer["lines"] = f"{window.first}-{window.last} of {of}"
        answer["content"] = numbered.number(lines[window.first - 1 : window.last], window.first)
    if window.last < total or not read.complete:
        left = f"{total - window.last}" if read.complete else "more"
        notes.append(f"{left} lines below: view(path={args.path!r}, start_line={window.last + 1})")
    if read.complete and total and window.last == total and not text.endswith("\n"):
        notes.append("no line break at the end of the file")
    if "\r\n" in text:
        notes.append("the file's lines end with CRLF (\\r\\n); shown without the \\r")
    if "\ufffd" in text and _not_utf8(data):
        notes.append("not valid UTF-8: undecodable bytes are shown as U+FFFD")
    if notes:
        answer["note"] = "; ".join(notes)
    return answer


def _not_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


class Edit(Arguments):
    path: FilePath
    old: Annotated[Text, Field(min_length=1, description="The exact text to replace.")]
    new: Annotated[Text, Field(description="What replaces it (empty: delete it).")]
    replace_all: Annotated[
        bool | None, Field(description="Replace every occurrence; default: old must be unique.")
    ] = None


@tools.tool(
    "edit",
    "Replace exact text in a file on the device. old must match the file exactly "
    "(whitespace and indentation too) and occur once, unless replace_all; include enough "
    "surrounding lines to make it unique. Refused, with nothing written, when old is "
    "missing or ambiguous or the file changed since it was read. Shows the lines around "
    "the change.",
)
async def edit(call: Call, args: Edit) -> dict[str, Any]:
    if args.old == args.new:
        raise Refused("old and new are the same text; nothing to change")
    path = call.bench.path(args.path)
    read = await _read(call, path, 1 << 62, MAX_EDIT_BYTES, first=MAX_EDIT_BYTES + 1)
    if not isinstance(read, _Read):
        return read
    data = read.data
    if not read.complete:
        raise Refused(
            f"{args.path} is larger than {MAX_EDIT_BYTES:,} bytes; edit it with apply_patch "
            "or shell"
        )
    if b"\0" in data[:BINARY_SNIFF]:
        raise Refused(f"{args.path} is a binary file; edit changes text files only")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise Refused(f"{args.path} is not UTF-8 text; edit it with apply_patch or shell") from None
    found = numbered.occurrences(text, args.old)
    if not found:
        hint = numbered.closest(text, args.old)
        raise Refused(
            f"old was not found in {args.path}; nothing was changed"
            + (f". Hint: {hint}" if hint else "; view the file and copy the text exactly")
        )
    if len(found) > 1 and not args.replace_all:
        lines = numbered.listed([numbered.line_of(text, at) for at in found])
        raise Refused(
            f"old occurs {len(found)} times in {args.path} (starting on lines {lines}); "
            "nothing was changed. Include more surrounding lines to make it unique, or set "
            "replace_all to change every one"
        )
    changed = (
        text.replace(args.old, args.new)
        if args.replace_all
        else text.replace(args.old, args.new, 1)
    )
    write = specs.WriteFile(path, changed.encode(), expected_sha256=hashlib.sha256(data).digest())
    unwritten = await _write(
        call,
        write,
        args.path,
        "expected_sha256 mismatch",
        f"{args.path} changed after it was read (another command, or a person?), or holds "
        "text the device masks as a secret; nothing was written. View it again and redo the "
        "edit (apply_patch for a file with masked secrets)",
    )
    if unwritten is not None:
        return unwritten
    return {
        "path": args.path,
        "replaced": len(found) if args.replace_all else 1,
        "snippet": _snippets(changed, found if args.replace_all else found[:1], args),
    }


def _snippets(changed: str, found: list[int], args: Edit) -> str:
    """The new text around the first few changes, numbered."""
    shift = len(args.new) - len(args.old)
    shown = []
    for index, at in enumerate(found[:3]):
        start = at + index * shift
        first = numbered.line_of(changed, start)
        shown.append(numbered.snippet(changed, first, first + args.new.count("\n")))
    more = len(found) - len(shown)
    return "\n…\n".join(shown) + (f"\n… and {more} more changes" if more > 0 else "")


async def _write(
    call: Call, spec: specs.WriteFile, shown: str, refused_when: str, refusal: str
) -> dict[str, Any] | None:
    """Write ``spec``; None once written, else the answer: still pending, the device's
    error, or (when it says ``refused_when``, the compare-and-swap failing) ``refusal``."""
    result = await file_op(call, spec)
    if not result.done:
        return call.bench.pending(result)
    if result.ok:
        return None
    if refused_when in (result.error or ""):
        raise Refused(refusal)
    return failed(shown, result)


class CreateFile(Arguments):
    path: FilePath
    content: Text


@tools.tool(
    "create_file",
    "Create a new file on the device (missing directories too). Refused if the file "
    "exists: edit it, or write_file to replace it whole.",
)
async def create_file(call: Call, args: CreateFile) -> dict[str, Any]:
    path, content = call.bench.path(args.path), args.content.encode()
    # An empty expected_sha256: the device writes only if nothing is there (no clobbering,
    # no race between looking and writing).
    spec = specs.WriteFile(path, content, create_parents=True, expected_sha256=b"")
    unwritten = await _write(
        call,
        spec,
        args.path,
        "already exists",
        f"{args.path} already exists; nothing was written. View it and edit it, or use "
        "write_file to replace it whole",
    )
    if unwritten is not None:
        return unwritten
    return {
        "path": args.path,
        "created": True,
        "lines": len(numbered.lines_of(args.content)),
        "bytes": len(content),
    }
