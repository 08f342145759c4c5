"""Text as the file tools show it: numbered lines, windows, and where an edit went wrong.

Pure functions over text: no device, no database. ``view`` and ``edit``
(:mod:`controlplane.workers.tools.files`) read a file through the device and shape what
the model sees here, in the ``cat -n`` form it knows (right-aligned number, a tab, the
line), so what it copies from a view into an edit is the file's text after the tab.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

MAX_LINE_CHARS = 2000  # a longer line is shown cut, saying how much was left out
CONTEXT_LINES = 3  # around an edit's change
MAX_SNIPPET_LINES = 40
MAX_LISTED = 20  # occurrences named by line number


def lines_of(text: str) -> list[str]:
    """The lines of ``text``, split at ``\n`` only (as the device's line numbers count),
    without it; a final line without one counts, an empty text has none."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def number(lines: list[str], first: int) -> str:
    """``lines`` numbered from ``first``, as ``cat -n`` shows them; long lines cut."""
    out = []
    for offset, line in enumerate(lines):
        line = line.removesuffix("\r")  # a CRLF file: view says so once
        if len(line) > MAX_LINE_CHARS:
            left = len(line) - MAX_LINE_CHARS
            line = f"{line[:MAX_LINE_CHARS]}… [{left} more characters on this line]"
        out.append(f"{first + offset:>6}\t{line}")
    return "\n".join(out)


@dataclass(frozen=True)
class Window:
    """Lines ``first``..``last`` (1-based, inclusive; ``last`` < ``first``: none), and what
    was adjusted to get there."""

    first: int
    last: int
    note: str = ""


def window(total: int, start: int | None, end: int | None, size: int, most: int) -> Window:
    """The lines to show of a file of ``total`` lines: from ``start`` (default 1) to ``end``
    (default ``start + size - 1``), at most ``most`` of them, clamped to the file."""
    notes = []
    first = 1 if start is None else start
    if first < 1:
        notes.append(f"start_line {first} is before the first line; from line 1")
        first = 1
    last = first + size - 1 if end is None else end
    if last < first:
        notes.append(f"end_line {last} is before start_line {first}; showing from start_line")
        last = first + size - 1
    if last - first + 1 > most:
        notes.append(f"at most {most} lines at a time")
        last = first + most - 1
    if total and first > total:
        notes.append(f"start_line {first} is past the end ({total} lines); the last lines")
        first = max(1, total - size + 1)
    return Window(first, min(last, total), "; ".join(notes))


def line_of(text: str, index: int) -> int:
    """The 1-based line number of character ``index`` of ``text``."""
    return text.count("\n", 0, index) + 1


def occurrences(text: str, old: str) -> list[int]:
    """Where each occurrence of ``old`` starts in ``text``, not overlapping (as
    ``str.replace`` counts them)."""
    found, at = [], text.find(old)
    while at >= 0:
        found.append(at)
        at = text.find(old, at + len(old))
    return found


def listed(numbers: list[int]) -> str:
    shown = ", ".join(str(n) for n in numbers[:MAX_LISTED])
    return shown + (f" and {len(numbers) - MAX_LISTED} more" if len(numbers) > MAX_LISTED else "")


def snippet(text: str, first: int, last: int) -> str:
    """Lines ``first``..``last`` of ``text`` with :data:`CONTEXT_LINES` around, numbered."""
    lines = lines_of(text)
    start = max(1, first - CONTEXT_LINES)
    end = min(len(lines), last + CONTEXT_LINES, start + MAX_SNIPPET_LINES - 1)
    return number(lines[start - 1 : end], start)


def closest(text: str, old: str) -> str:
    """A hint at where ``old`` (not found in ``text``) was probably meant to be: the same
    lines but for whitespace, or the line most like its first line. Empty: no idea."""
    lines = lines_of(text)
    wanted = [line.strip() for line in lines_of(old) if line.strip()]
    if not wanted or not lines:
        return ""
    if "\r\n" in text and "\r\n" not in old and "\n" in old:
        return "the file's lines end with CRLF (\\r\\n); old uses \\n"
    stripped = [line.strip() for line in lines]
    for i in range(len(lines)):
        if stripped[i] != wanted[0]:
            continue
        region: list[str] = []
        j = i
        while j < len(lines) and len(region) < len(wanted):
            if stripped[j]:
                region.append(stripped[j])
            j += 1
        if region == wanted:
            return (
                f"lines {i + 1}-{j} match but for whitespace (indentation, tabs or blank"
                f" lines); as they are:\n{number(lines[i:j], i + 1)}"
            )
    best = difflib.get_close_matches(wanted[0], stripped, n=1, cutoff=0.6)
    if not best:
        return ""
    at = stripped.index(best[0])
    shown = lines[at : at + min(len(wanted), MAX_SNIPPET_LINES // 4) + 2]
    return f"the closest line to old's first line is line {at + 1}:\n{number(shown, at + 1)}"
