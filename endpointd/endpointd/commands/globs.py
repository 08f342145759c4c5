"""Glob patterns and ``.gitignore`` rules, as a search and a glob op match paths.

A glob (:func:`translate`), so ``search(glob="*.py")`` and ``glob("*.py")`` mean what a
``.gitignore`` line ``*.py`` does: ``*`` and ``?`` stay within one path component, ``**``
spans any number of them, ``[...]`` is a character class, ``{a,b}`` an alternative, and a
pattern without a ``/`` matches a file's name at any depth (as ripgrep's ``-g`` and git
do); with one, it matches the whole path relative to where it is anchored.

``.gitignore`` files are honoured as git documents them (gitignore(5)), by ``pathspec``'s
``GitIgnoreSpec`` (checked against ``git check-ignore`` itself,
tests/endpointd/commands/test_gitignore_differential.py): ``#`` comments, ``!`` re-includes,
a trailing ``/`` matches directories only, the last matching line wins; a deeper file's
verdict comes before a shallower one's, and the walk does not enter an ignored directory.
Not read: ``.git/info/exclude`` and ``core.excludesFile``, which live outside the searched
tree.

No file access (the walk reads ``.gitignore`` files and hands their text here).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pathspec

# Lines longer than this in a .gitignore are no pattern anyone wrote by hand.
_MAX_RULE = 4096


def translate(pattern: str) -> str:
    """A regular expression (no anchors) for a ``/``-separated glob ``pattern``."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            if pattern.startswith("**", i):
                end = i + 2
                whole = (i == 0 or pattern[i - 1] == "/") and (end == n or pattern[end] == "/")
                if whole and end == n:
                    out.append(".*")  # "dir/**": everything beneath
                    i = end
                    continue
                if whole:
                    out.append("(?:.*/)?")  # "**/": zero or more directories
                    i = end + 1
                    continue
                out.append("[^/]*")  # "a**b": as "*"
                i = end
                continue
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            close = _class_end(pattern, i)
            if close < 0:
                out.append(re.escape(c))
            else:
                out.append(_char_class(pattern[i + 1 : close]))
                i = close
        elif c == "{":
            close = pattern.find("}", i)
            if close < 0 or "{" in pattern[i + 1 : close]:
                out.append(re.escape(c))
            else:
                options = pattern[i + 1 : close].split(",")
                out.append("(?:" + "|".join(translate(o) for o in options) + ")")
                i = close
        elif c == "\\" and i + 1 < n:
            i += 1
            out.append(re.escape(pattern[i]))
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def _class_end(pattern: str, start: int) -> int:
    """Where the class opened at ``start`` closes (a ``]`` first inside is literal), or -1."""
    j = start + 1
    if j < len(pattern) and pattern[j] in "!^":
        j += 1
    if j < len(pattern) and pattern[j] == "]":
        j += 1
    return pattern.find("]", j)


def _char_class(body: str) -> str:
    negate = body[:1] in ("!", "^")
    if negate:
        body = body[1:]
    escaped = body.replace("\\", "\\\\").replace("[", "\\[").replace("]", "\\]")
    # A class never matches the separator, negated or not.
    return f"[^/{escaped}]" if negate else f"(?!/)[{escaped}]"


@dataclass(frozen=True)
class PathGlob:
    """A glob as ``search(glob=…)`` and the glob op take it."""

    regex: re.Pattern[str]
    by_name: bool  # no "/" in the pattern: matched against the file's name

    @classmethod
    def parse(cls, pattern: str) -> PathGlob:
        """Raises ValueError (one line) for a pattern that cannot be translated."""
        cleaned = pattern.strip()
        while cleaned.startswith("./"):
            cleaned = cleaned[2:]
        by_name = "/" not in cleaned.rstrip("/")
        cleaned = cleaned.lstrip("/")
        try:
            return cls(re.compile(translate(cleaned), re.DOTALL), by_name)
        except re.error as exc:
            raise ValueError(f"invalid glob {pattern!r}: {exc}") from None

    def matches(self, rel: str) -> bool:
        """Does the file at ``rel`` (relative to the searched directory) match?"""
        subject = rel.rpartition("/")[2] if self.by_name else rel
        return self.regex.fullmatch(subject) is not None


@dataclass(frozen=True)
class IgnoreFile:
    """The rules of one ``.gitignore``, anchored at its directory (``base``, a real path)."""

    base: str
    spec: pathspec.GitIgnoreSpec

    @classmethod
    def parse(cls, base: str, text: str) -> IgnoreFile:
        lines = [line[:_MAX_RULE] for line in text.splitlines()]
        try:
            spec = pathspec.GitIgnoreSpec.from_lines(lines)
        except ValueError:
            # A line git would not match either (an invalid pattern): dropped, and the rest
            # kept, one at a time.
            spec = pathspec.GitIgnoreSpec.from_lines(_valid_lines(lines))
        return cls(base, spec)

    @property
    def empty(self) -> bool:
        return not any(p.include is not None for p in self.spec.patterns)

    def verdict(self, real: str, is_dir: bool) -> bool | None:
        """True: ignored; False: re-included (``!``); None: no rule here says."""
        prefix = self.base.rstrip("/") + "/"
        if not real.startswith(prefix):
            return None
        rel = real[len(prefix) :]
        # Pattern by pattern, the last match winning, rather than spec.check_file, whose
        # verdicts are for files below a directory too: here only the entry itself counts
        # (the walk prunes what is below an ignored directory, and a directory the caller
        # names is searched even if ignored). So a directory is tested with a trailing "/"
        # only against directory-only patterns ("logs/**", everything beneath, must not
        # take "logs" itself), and a match through a directory above the entry (pathspec's
        # "ps_d" group, ending before the path does) is not the entry's.
        for pattern in reversed(self.spec.patterns):
            if pattern.include is None or pattern.regex is None:
                continue  # a comment or a blank line
            dir_only = str(pattern.pattern).rstrip(" ").endswith("/")
            candidate = rel + "/" if is_dir and dir_only else rel
            match = pattern.regex.match(candidate)
            if match is None:
                continue
            if "ps_d" in match.re.groupindex and -1 < match.end("ps_d") < len(candidate):
                continue
            return bool(pattern.include)
        return None


def _valid_lines(lines: list[str]) -> list[str]:
    valid = []
    for line in lines:
        try:
            pathspec.GitIgnoreSpec.from_lines([line])
        except ValueError:
            continue
        valid.append(line)
    return valid


class Ignores:
    """The ``.gitignore`` files in force in one directory: its ancestors' and its own."""

    def __init__(self, files: tuple[IgnoreFile, ...] = ()) -> None:
        self.files = files

    def with_file(self, file: IgnoreFile | None) -> Ignores:
        return self if file is None or file.empty else Ignores((*self.files, file))

    def ignored(self, real: str, is_dir: bool) -> bool:
        """Is ``real`` ignored? The deepest file with a matching rule decides."""
        for file in reversed(self.files):
            verdict = file.verdict(real, is_dir)
            if verdict is not None:
                return verdict
        return False
