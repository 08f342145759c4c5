"""Tables for both command lines: each column as wide as its widest cell, so that a long
name widens its column instead of pushing the row out of line; on a terminal the last
column wraps to its width (continuation lines indented under it), piped it does not.

Hand-aligned format strings (``{name:<20}``) once did this in two dozen places, each with a
guess at how long a name would be.
"""

from __future__ import annotations

import shutil
import sys
import textwrap
from collections.abc import Collection, Sequence

GAP = "  "
MIN_LAST = 20  # the last column is never squeezed narrower than this to fit


def render(
    header: Sequence[str],
    rows: Sequence[Sequence[object]],
    *,
    right: Collection[int] = (),
    width: int | None = None,
) -> list[str]:
    """The table's lines: the header, then a line per row (more when the last cell wraps).
    Columns in ``right`` (by index) align right, as numbers do."""
    return [line for group in layout(header, rows, right=right, width=width) for line in group]


def layout(
    header: Sequence[str],
    rows: Sequence[Sequence[object]],
    *,
    right: Collection[int] = (),
    width: int | None = None,
) -> list[list[str]]:
    """:func:`render`'s lines grouped: the header's, then each row's (for a caller that
    prints something under each row)."""
    cells = [[str(c) for c in header], *[[str(c) for c in row] for row in rows]]
    columns = len(header)
    widths = [max(len(row[i]) for row in cells) for i in range(columns - 1)]
    lead = sum(widths) + len(GAP) * (columns - 1)
    if width is None and sys.stdout.isatty():
        width = shutil.get_terminal_size().columns
    # Piped, nothing wraps: a script reading the table gets one line per row.
    room = max(MIN_LAST, width - lead) if width is not None else 1 << 30
    groups = []
    for row in cells:
        parts = [
            row[i].rjust(widths[i]) if i in right else row[i].ljust(widths[i])
            for i in range(columns - 1)
        ]
        last = textwrap.wrap(row[-1], room, break_on_hyphens=False) or [""]
        first = (GAP.join([*parts, last[0]])).rstrip()
        groups.append([first, *(" " * lead + more for more in last[1:])])
    return groups
