"""The worker's search operations: ``search`` (file contents) and ``glob`` (file names).

Both walk the tree beneath ``op.path`` with :mod:`endpointd.commands.tree`, which gives
every file the checks a ``read_file`` (search) or a listing entry (glob) of its own would
get, skips what ``.gitignore`` ignores, and never follows a symlink. A search then matches
lines with ripgrep when the daemon's PATH has ``rg`` (fed only descriptors the walk opened
and judged: :mod:`endpointd.commands.ripgrep`), else with Python's ``re``; both see the same
files in the same order, so the answer is the same but for the regular expression dialects
(Rust's regex or Python's ``re``; their common subset behaves alike, and ``literal`` is
exact in both).

A search answers in JSON Lines on the DATA stream, ``{"path", "line", "text"}``, the path
relative to ``op.path`` (``""`` when ``op.path`` is the file searched), the line 1-based and
its text without the line break, cut at :data:`MAX_TEXT_CHARS`. Files with a NUL byte in
their first 8 KiB are binary (git's rule) and skipped. A glob answers with paths, one per
line, newest first. ``max_matches`` / ``max_entries`` stop it (0: no limit but the policy's
max output); hitting the policy's max output or :data:`SEARCH_SECONDS` ends it as a
failure whose message says so, after the results found so far.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Generator, Iterator

from endpointd.commands import ripgrep
from endpointd.commands.fileops import OpResult
from endpointd.commands.globs import PathGlob
from endpointd.commands.ripgrep import Opened
from endpointd.commands.tree import Checkers, open_checked, walk_files
from endpointd.guard.files import Checker, PathRefused
from endpointd.spool import STREAM_DATA, SpoolWriter
from superagent_shared.messages import Glob, Search

MAX_TEXT_CHARS = 500
SEARCH_SECONDS = 120.0
BINARY_SNIFF = 8000  # bytes git looks at for a NUL
_CHUNK = 1 << 20
_MAX_LINE = 16 << 20  # a "line" longer than this is cut in two for matching
_FLUSH = 64 * 1024


class _Stop(Exception):
    """The answer cannot grow: the policy's max output, or the time limit."""


class _Answer:
    """Lines for the DATA stream, batched, within the policy's max output."""

    def __init__(self, out: SpoolWriter, max_output: int | None) -> None:
        self.out = out
        self.room = max_output
        self.batch = bytearray()
        self.count = 0
        self.capped = False  # stopped at max_matches / max_entries

    def add(self, line: bytes) -> None:
        if self.room is not None:
            if len(line) > self.room:
                raise _Stop(
                    f"stopped after {self.count} results: the device's policy caps output at"
                    " its max output size"
                )
            self.room -= len(line)
        self.batch += line
        self.count += 1
        if len(self.batch) >= _FLUSH:
            self.flush()

    def flush(self) -> None:
        if self.batch:
            self.out.append(STREAM_DATA, bytes(self.batch))
            self.batch.clear()


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
    checks = Checkers(denied=denied, judge=judge, entries=entries)
    answer = _Answer(out, max_output)
    try:
        if isinstance(op, Search):
            _search(op, root, checks, answer)
        else:
            _glob(op, root, checks, answer)
    except _Stop as stop:
        return OpResult(1, f"{op.KIND} {op.path}: {stop}")
    except ValueError as exc:  # a pattern or glob that cannot be used
        return OpResult(1, f"{op.KIND}: {exc}")
    except PathRefused as exc:
        return OpResult(1, str(exc))
    except FileNotFoundError:
        return OpResult(1, f"no such file or directory: {op.path}")
    except NotADirectoryError:
        return OpResult(1, f"not a directory: {op.path}")
    except OSError as exc:
        return OpResult(1, f"error searching {op.path}: {exc.strerror or exc}")
    finally:
        answer.flush()
    return OpResult(truncated=answer.capped)


def _glob(op: Glob, root: str, checks: Checkers, answer: _Answer) -> None:
    wanted = PathGlob.parse(op.pattern)
    deadline = time.monotonic() + SEARCH_SECONDS
    found: list[tuple[float, str]] = []
    for candidate in walk_files(root, op.path, checks, allow_file=False):
        if wanted.matches(candidate.rel):
            found.append((candidate.mtime, candidate.rel))
        if time.monotonic() > deadline:
            raise _Stop(f"took longer than {SEARCH_SECONDS:.0f} s; narrow the path")
    found.sort(key=lambda item: (-item[0], item[1]))
    answer.capped = bool(op.max_entries) and len(found) > op.max_entries
    for _, rel in found[: op.max_entries or None]:
        answer.add(_utf8(rel).encode("utf-8") + b"\n")


def _search(op: Search, root: str, checks: Checkers, answer: _Answer) -> None:
    if "\n" in op.pattern or "\r" in op.pattern:
        raise ValueError("the pattern contains a line break; a search matches within one line")
    only = PathGlob.parse(op.glob) if op.glob else None
    rg = ripgrep.find()
    regex = None if rg else _compile(op)
    files = _Readable(root, op.path, checks, only)
    matches = _matches(iter(files), op, rg, regex)
    try:
        for rel, number, text in matches:
            record = {"path": _utf8(rel), "line": number, "text": _capped(text)}
            answer.add(json.dumps(record, ensure_ascii=False).encode("utf-8") + b"\n")
            if op.max_matches and answer.count >= op.max_matches:
                answer.capped = True  # there may be more
                return
    finally:
        matches.close()  # closes every descriptor still open, and stops ripgrep
    if files.timed_out:
        raise _Stop(f"took longer than {SEARCH_SECONDS:.0f} s; narrow the path or glob")


def _compile(op: Search) -> re.Pattern[str]:
    flags = re.MULTILINE | (re.IGNORECASE if op.ignore_case else 0)
    try:
        return re.compile(re.escape(op.pattern) if op.literal else op.pattern, flags)
    except re.error as exc:
        raise ValueError(f"invalid regular expression {op.pattern!r}: {exc}") from None


def _utf8(name: str) -> str:
    """A path as UTF-8 text: a name that is not (kept by os as surrogates) gets U+FFFD."""
    return name.encode("utf-8", errors="surrogateescape").decode("utf-8", errors="replace")


def _capped(text: str) -> str:
    text = text.removesuffix("\n").removesuffix("\r")
    return text if len(text) <= MAX_TEXT_CHARS else text[:MAX_TEXT_CHARS] + "…"


class _Readable:
    """The text files to search, opened and judged, until :data:`SEARCH_SECONDS` pass
    (``timed_out``). Each descriptor yielded is the consumer's to close."""

    def __init__(self, root: str, path: str, checks: Checkers, only: PathGlob | None) -> None:
        self.root, self.path, self.checks, self.only = root, path, checks, only
        self.timed_out = False

    def __iter__(self) -> Iterator[Opened]:
        deadline = time.monotonic() + SEARCH_SECONDS
        for candidate in walk_files(self.root, self.path, self.checks, allow_file=True):
            if time.monotonic() > deadline:
                self.timed_out = True
                return
            if self.only is not None and not self.only.matches(candidate.rel or candidate.name):
                continue
            fd = open_checked(candidate, self.root, self.checks.judge)
            if fd is None:
                continue
            try:
                binary = b"\0" in os.pread(fd, BINARY_SNIFF, 0)
            except OSError:
                binary = True  # unreadable: nothing to show either way
            if binary:
                os.close(fd)
                continue
            yield Opened(candidate.rel, fd, candidate.size)


def _matches(
    files: Iterator[Opened], op: Search, rg: str | None, regex: re.Pattern[str] | None
) -> Generator[tuple[str, int, str]]:
    for batch in ripgrep.batches(files):
        try:
            if rg is not None:
                found = ripgrep.search(
                    rg, batch, op.pattern, literal=op.literal, ignore_case=op.ignore_case
                )
                try:
                    with contextlib.closing(found):
                        for opened, number, text in found:
                            yield opened.rel, number, text
                    continue
                except ripgrep.PatternError as exc:
                    raise ValueError(f"invalid regular expression {op.pattern!r}: {exc}") from None
                except OSError:
                    rg, regex = None, _compile(op)  # rg went away: the rest in Python
            assert regex is not None
            for opened in batch:
                for number, text in _scan(opened.fd, regex):
                    yield opened.rel, number, text
        finally:
            for opened in batch:
                os.close(opened.fd)


def _scan(fd: int, regex: re.Pattern[str]) -> Iterator[tuple[int, str]]:
    """Each line of the file at ``fd`` that ``regex`` matches: (1-based number, line)."""
    first = 1  # the number of the first line in the block
    carry = b""
    offset = 0
    while True:
        piece = os.pread(fd, _CHUNK, offset)
        offset += len(piece)
        data = carry + piece
        if piece:
            cut = data.rfind(b"\n") + 1
            if cut == 0 and len(data) < _MAX_LINE:
                carry = data
                continue
            block, carry = (data[:cut], data[cut:]) if cut else (data, b"")
        else:
            block, carry = data, b""
        text = block.decode("utf-8", errors="replace")
        yield from _block(text, regex, first)
        first += text.count("\n")
        if not piece:
            return


def _block(text: str, regex: re.Pattern[str], first: int) -> Iterator[tuple[int, str]]:
    """Matching lines of ``text`` (whole lines): the regex scans the block at C speed, and
    each hit is confirmed on its line alone, so a match never spans a line break."""
    pos, counted, number = 0, 0, first
    while pos <= len(text):
        hit = regex.search(text, pos)
        if hit is None:
            return
        start = text.rfind("\n", 0, hit.start()) + 1
        if start >= len(text):
            return  # past the last line break: no line there
        end = text.find("\n", hit.start())
        end = len(text) if end < 0 else end
        number += text.count("\n", counted, start)
        counted = start
        line = text[start:end]
        if regex.search(line):
            yield number, line
        pos = end + 1
