"""Masks registered credential values, and the ways a program may print them, in outbound bytes.

Every byte that leaves the device (command output, file reads, error messages, endpointd's
own logs) passes through a :class:`Redactor` built from all registered credential values.
For each value it masks:

* the raw value, and each line (of 4 characters or more) of a multi-line value;
* its base64, standard and URL-safe alphabets, with the value at each of the three byte
  offsets modulo 3 inside the encoded stream, padded or not. Only the characters determined
  by the value alone are masked: the one or two characters at either edge that mix in the
  neighbouring (unknown) bytes cannot be predicted, so they stay;
* its URL encoding: every reserved byte percent-encoded, also as ``urllib.parse.quote``
  (keeps '/') and ``encodeURIComponent`` (keeps ``!'()*``) do it, and the form encoding with
  '+' for a space; hex digits in either case;
* its JSON-string escaping (``json.dumps`` without the quotes, ASCII-only or not, also with
  ``<``, ``>``, ``&`` escaped as Go does);
* its shell escaping (``shlex.quote``, a backslash before every special byte, and the
  escaping inside double quotes).

Each encoding is applied to the whole value; each line of a multi-line value is masked raw.
Derived patterns shorter than 6 bytes are dropped (they would mask ordinary text); the raw
value is always kept.

Masking is same-length: each byte of a match becomes ``*``, so offsets in the output equal
offsets in the input. Overlapping and adjacent matches are all masked.

:class:`StreamRedactor` works on a stream fed in arbitrary chunks: it holds back only the
longest suffix of what it was fed that is a proper prefix of some pattern (anything else is
released at once) and releases that tail on :meth:`StreamRedactor.flush`.

Matching uses Hyperscan (Vectorscan) in block mode over the held tail plus the new chunk: one
database per :class:`Redactor`, compiled once. Without the ``hyperscan`` module (or on a CPU it
cannot target) a pure-Python matcher (``bytes.find`` per pattern) gives the same output,
slower. With no credentials registered, :meth:`StreamRedactor.feed` returns its input
unchanged and imports nothing.

This module must never reveal a value: no value or pattern appears in a repr, a log line or
an exception message.
"""

from __future__ import annotations

import builtins
import functools
import logging
import os
import threading
from typing import TYPE_CHECKING, Any, Final, Literal

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping

__all__ = ["Redactor", "StreamRedactor", "credential_patterns"]

log = logging.getLogger(__name__)

Engine = Literal["auto", "hyperscan", "python"]

MASK: Final = b"*"
MIN_LINE_CHARS: Final = 4
"""Lines of a multi-line value shorter than this are not masked on their own."""
MIN_DERIVED_BYTES: Final = 6
"""Encoded forms (and encoded lines) shorter than this are dropped."""
# Held-back tails of LEAD bytes or more are found by scanning the end of the stream for the
# patterns' first LEAD bytes ("leads"); shorter ones by looking the last bytes up in a set.
LEAD: Final = 6

# The characters shlex.quote leaves alone; every other ASCII byte gets a backslash in the
# unquoted backslash form.
_SHELL_SAFE: Final = frozenset(
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_@%+=:,./-"
)
# Special inside double quotes (POSIX): these take a backslash there.
_DQUOTE_SPECIAL: Final = frozenset(b'"\\$`')


def credential_patterns(value: bytes) -> set[bytes]:
    """Every byte string that gives away ``value``, as masked by :class:`Redactor`."""
    if not value:
        return set()
    patterns = {value}
    patterns.update(f for f in _encodings(value) if len(f) >= MIN_DERIVED_BYTES)
    # Each line of a multi-line value on its own, as a program printing part of it (a PEM
    # body, one line of a config) shows it. Raw only: encoding a single line of a secret is
    # not something programs do, and each encoded line would cost the matcher ~20 patterns.
    if b"\n" in value or b"\r" in value:
        for line in value.splitlines():
            for candidate in (line, line.strip()):
                if _char_len(candidate) >= MIN_LINE_CHARS:
                    patterns.add(candidate)
    return patterns


def _char_len(data: bytes) -> int:
    try:
        return len(data.decode("utf-8"))
    except UnicodeDecodeError:
        return len(data)


def _encodings(value: bytes) -> Iterator[bytes]:
    yield from _base64_forms(value)
    yield from _url_forms(value)
    yield from _json_forms(value)
    yield from _shell_forms(value)


def _base64_forms(value: bytes) -> Iterator[bytes]:
    import base64

    for shift in (0, 1, 2):
        encoded = base64.b64encode(bytes(shift) + value)
        # Character i carries bits 6i..6i+5 of the encoded bytes; the value occupies bits
        # 8*shift .. 8*(shift+len)-1. Characters wholly inside that range are the value's own.
        first = -(-8 * shift // 6)
        end = 8 * (shift + len(value)) // 6
        forms = [encoded[first:end]]
        if end < len(encoded):
            # The value ends the encoded stream: the last character is zero-filled, so it is
            # known too, and so is the padding that follows it.
            forms += [encoded[first : end + 1], encoded[first:]]
        for form in forms:
            yield form
            yield form.translate(_URLSAFE)


_URLSAFE: Final = bytes.maketrans(b"+/", b"-_")


def _url_forms(value: bytes) -> Iterator[bytes]:
    import re
    from urllib.parse import quote, quote_plus

    lower = re.compile(r"%[0-9A-F]{2}")
    for form in (
        quote(value, safe=""),
        quote(value, safe="/"),
        quote(value, safe="!'()*"),  # encodeURIComponent
        quote_plus(value, safe=""),
    ):
        yield form.encode("ascii")
        yield lower.sub(lambda m: m.group(0).lower(), form).encode("ascii")


def _json_forms(value: bytes) -> Iterator[bytes]:
    import json

    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return  # no JSON encoder emits undecodable bytes as they are
    for ensure_ascii in (True, False):
        form = json.dumps(text, ensure_ascii=ensure_ascii)[1:-1]
        yield form.encode("utf-8")
        # Go's encoding/json (and others) escape HTML-special characters.
        yield (
            form.replace("<", "\\u003c")
            .replace(">", "\\u003e")
            .replace("&", "\\u0026")
            .replace("\u2028", "\\u2028")
            .replace("\u2029", "\\u2029")
            .encode("utf-8")
        )


def _shell_forms(value: bytes) -> Iterator[bytes]:
    import shlex

    # shlex.quote works on str; latin-1 maps bytes to code points one to one (and its
    # safe-character test is ASCII-only), so this is shlex.quote on the raw bytes.
    quoted = shlex.quote(value.decode("latin-1")).encode("latin-1")
    yield quoted
    if quoted != value:
        yield quoted[1:-1]  # the part inside the quotes, e.g. inside a longer quoted word
    yield b"".join(
        bytes((c,)) if c in _SHELL_SAFE or c >= 0x80 else b"\\" + bytes((c,)) for c in value
    )
    yield b"".join(b"\\" + bytes((c,)) if c in _DQUOTE_SPECIAL else bytes((c,)) for c in value)


# --- matching engines ------------------------------------------------------------------------
#
# An engine finds (a) every occurrence of every pattern in a buffer, as (start, end) spans, and
# (b) every occurrence of every lead (the first LEAD bytes of the patterns longer than that) in
# the last bytes of a buffer, as (lead id, start). Both engines give identical results.

Span = tuple[int, int]
LeadHit = tuple[int, int]


def _collect_span(pattern_id: int, start: int, end: int, _flags: int, spans: Any) -> None:
    if pattern_id != _PAD_ID:
        spans.append((start, end))


def _collect_lead(lead_id: int, start: int, _end: int, _flags: int, leads: Any) -> None:
    if lead_id != _PAD_ID:
        leads.append((lead_id, start))


_HEX_ESCAPES: Final = [b"\\x%02x" % c for c in range(256)]

# Hyperscan picks its literal matcher by the number of literals. Below about 50 (2 to 5
# credentials) it picks one that scans base64-like output 2-4 times slower than the one it
# uses for more: with 3 credentials a 64 KiB chunk costs 14 µs with filler literals up to
# MIN_LITERALS, 30 µs without (bench/RESULTS.md, redaction). The fillers consist of bytes that
# never occur in UTF-8 (0xC0, 0xC1, 0xF5-0xFF); a match of one, in binary output, is ignored.
MIN_LITERALS: Final = 64
_PAD_ID: Final = 0x7FFFFFFF
_NEVER_UTF8: Final = bytes([0xC0, 0xC1, *range(0xF5, 0x100)])


def _padding(count: int) -> list[bytes]:
    """``count`` distinct 16-byte fillers: the index in base 13, then pseudo-random bytes."""
    base = len(_NEVER_UTF8)
    fillers = []
    for i in range(count):
        x = i + 1
        tail = []
        for _ in range(13):
            x = (x * 1103515245 + 12345) % 2**31
            tail.append(_NEVER_UTF8[(x >> 16) % base])
        fillers.append(bytes(_NEVER_UTF8[i // base**k % base] for k in range(3)) + bytes(tail))
    return fillers


class _HyperscanEngine:
    """Two compiled databases (patterns; leads), shared by every stream of one Redactor."""

    name: Final = "hyperscan"

    def __init__(self, patterns: list[bytes], leads: list[bytes]) -> None:
        import hyperscan

        self._patterns = self._compile(hyperscan, patterns)
        # A separate database, scanned only over the last max_len - 1 bytes of what was fed:
        # six-byte literals in the main one would double its cost.
        self._leads = self._compile(hyperscan, leads) if leads else None
        self._local = threading.local()

    @staticmethod
    def _compile(hyperscan: Any, literals: list[bytes]) -> Any:
        padding = max(0, MIN_LITERALS - len(literals))
        db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        # Every byte escaped: the pure-literal compiler takes NUL-terminated strings, and a
        # value may contain any byte.
        db.compile(
            expressions=[
                b"".join(_HEX_ESCAPES[c] for c in lit) for lit in literals + _padding(padding)
            ],
            ids=list(range(len(literals))) + [_PAD_ID] * padding,
            flags=hyperscan.HS_FLAG_SOM_LEFTMOST,
        )
        return db

    def scanner(self) -> _HyperscanScanner:
        """A scanner with its own scratch space (the scan releases the GIL: one per thread)."""
        return _HyperscanScanner(self._patterns, self._leads)

    def thread_scanner(self) -> _HyperscanScanner:
        scanner: _HyperscanScanner | None = getattr(self._local, "scanner", None)
        if scanner is None:
            scanner = self._local.scanner = self.scanner()
        return scanner

    def size(self) -> int:
        leads = 0 if self._leads is None else self._leads.size()
        return int(self._patterns.size()) + int(leads)


class _HyperscanScanner:
    __slots__ = ("_lead_scan", "_lead_scratch", "_scan", "_scratch")

    def __init__(self, patterns: Any, leads: Any) -> None:
        self._scan = patterns.scan
        self._scratch = patterns.scratch.clone()
        self._lead_scan = None if leads is None else leads.scan
        self._lead_scratch = None if leads is None else leads.scratch.clone()

    def spans(self, data: bytes) -> list[Span]:
        spans: list[Span] = []
        self._scan(data, match_event_handler=_collect_span, context=spans, scratch=self._scratch)
        return spans

    def leads(self, data: bytes) -> list[LeadHit]:
        hits: list[LeadHit] = []
        if self._lead_scan is not None:
            self._lead_scan(
                data, match_event_handler=_collect_lead, context=hits, scratch=self._lead_scratch
            )
        return hits


class _PythonEngine:
    """The same results with ``bytes.find``: every occurrence of every literal, overlaps too.

    One search per pattern: ``find`` skips ahead by about the needle's length, so searching
    for whole patterns beats searching for their shared leads and checking each candidate.
    """

    name: Final = "python"

    def __init__(self, patterns: list[bytes], leads: list[bytes]) -> None:
        self._patterns = patterns
        self._leads = leads

    def scanner(self) -> _PythonEngine:
        return self

    thread_scanner = scanner

    def size(self) -> int:
        return 0

    def spans(self, data: bytes) -> list[Span]:
        return [(s, s + len(p)) for _, s, p in self._find_all(self._patterns, data)]

    def leads(self, data: bytes) -> list[LeadHit]:
        return [(i, s) for i, s, _ in self._find_all(self._leads, data)]

    @staticmethod
    def _find_all(literals: list[bytes], data: bytes) -> Iterator[tuple[int, int, bytes]]:
        find = data.find
        for index, literal in enumerate(literals):
            at = find(literal)
            while at >= 0:
                yield index, at, literal
                at = find(literal, at + 1)


_Engine = _HyperscanEngine | _PythonEngine
_Scanner = _HyperscanScanner | _PythonEngine


def _make_engine(patterns: list[bytes], leads: list[bytes], engine: Engine) -> _Engine:
    if engine == "auto":
        forced = os.environ.get("ENDPOINTD_REDACT_ENGINE", "").strip().lower()
        if forced == "hyperscan":
            engine = "hyperscan"
        elif forced == "python":
            engine = "python"
    if engine == "python":
        return _PythonEngine(patterns, leads)
    try:
        return _HyperscanEngine(patterns, leads)
    except ImportError:
        if engine == "hyperscan":
            raise
        _warn_fallback("hyperscan is not installed")
    except Exception as exc:  # hyperscan.error, e.g. a CPU the library cannot target
        if engine == "hyperscan":
            raise
        # The type only: a compile error's text could in principle quote a pattern.
        _warn_fallback(f"hyperscan cannot compile the patterns ({type(exc).__name__})")
    return _PythonEngine(patterns, leads)


@functools.cache
def _warn_fallback(reason: str) -> None:
    """Once per reason: a Redactor is built for every change of the credentials."""
    log.warning("%s; redacting with the slower pure-Python matcher", reason)


def _mask(out: bytearray, spans: Iterable[Span]) -> None:
    for start, end in spans:
        out[start:end] = MASK * (end - start)


# --- the public interface --------------------------------------------------------------------


class Redactor:
    """All registered credential values, compiled once; hands out :class:`StreamRedactor` s.

    ``engine`` picks the matcher: ``"auto"`` (Hyperscan when it imports and compiles,
    otherwise Python, with a warning in the log), ``"hyperscan"`` (raise if it cannot be
    used) or ``"python"`` (the fallback, for tests and comparison). The environment variable
    ``ENDPOINTD_REDACT_ENGINE=python|hyperscan`` overrides ``"auto"``.

    Thread-safe: one-shot calls use a scanner per thread, and every stream has its own.
    """

    def __init__(self, values: Mapping[str, builtins.bytes], *, engine: Engine = "auto") -> None:
        patterns: set[builtins.bytes] = set()
        for value in values.values():
            patterns |= credential_patterns(builtins.bytes(value))
        # Deterministic order: the same credentials always compile to the same databases.
        self._patterns = sorted(patterns, key=lambda p: (len(p), p))
        self.max_len: int = len(self._patterns[-1]) if self._patterns else 0
        """Length of the longest pattern; a held-back tail is always shorter."""
        # Patterns longer than LEAD, grouped by their first LEAD bytes (dicts keep order).
        groups: dict[builtins.bytes, list[builtins.bytes]] = {}
        for pattern in self._patterns:
            if len(pattern) > LEAD:
                groups.setdefault(pattern[:LEAD], []).append(pattern)
        self._lead_groups = list(groups.values())
        # The proper prefixes shorter than LEAD (longer ones are found by scanning for leads).
        self._short = frozenset(p[:m] for p in self._patterns for m in range(1, min(LEAD, len(p))))
        self._engine: _Engine | None = None
        if self._patterns:
            self._engine = _make_engine(self._patterns, list(groups), engine)

    def covers(self, values: Iterable[builtins.bytes]) -> bool:
        """Whether every one of ``values`` is masked by this redactor."""
        known = set(self._patterns)
        return all(builtins.bytes(value) in known for value in values)

    @classmethod
    def empty(cls) -> Redactor:
        """A redactor that masks nothing (no credentials registered)."""
        return cls({})

    @property
    def engine(self) -> Literal["none", "hyperscan", "python"]:
        """The matcher in use: ``"none"`` when there is nothing to mask."""
        return "none" if self._engine is None else self._engine.name

    @property
    def pattern_count(self) -> int:
        return len(self._patterns)

    @property
    def database_size(self) -> int:
        """Bytes of the compiled Hyperscan databases (0 for the other engines)."""
        return 0 if self._engine is None else self._engine.size()

    def __repr__(self) -> str:
        return f"<Redactor {len(self._patterns)} patterns, engine={self.engine}>"

    def stream(self) -> StreamRedactor:
        """A new stream; feed it from one thread at a time."""
        return StreamRedactor(self)

    def bytes(self, data: builtins.bytes) -> builtins.bytes:
        """``data`` with every match masked (one-shot: nothing is held back)."""
        if self._engine is None or not data:
            return data
        spans = self._engine.thread_scanner().spans(data)
        if not spans:
            return data
        out = bytearray(data)
        _mask(out, spans)
        return builtins.bytes(out)

    def text(self, s: str) -> str:
        """``s`` with every match masked; a character any part of which matched becomes one ``*``.

        Matching runs on the UTF-8 encoding, as for output bytes; masking whole characters
        keeps the result a valid string with as many characters as ``s``.
        """
        if self._engine is None or not s:
            return s
        data = s.encode("utf-8", "surrogatepass")
        spans = self._engine.thread_scanner().spans(data)
        if not spans:
            return s
        if len(data) == len(s):  # ASCII: bytes and characters coincide
            out = bytearray(data)
            _mask(out, spans)
            return out.decode("ascii")
        import bisect
        import itertools

        # starts[i]: the byte offset of character i.
        starts = list(
            itertools.accumulate((len(c.encode("utf-8", "surrogatepass")) for c in s), initial=0)
        )
        chars = list(s)
        for start, end in spans:
            first = bisect.bisect_right(starts, start) - 1
            last = bisect.bisect_left(starts, end)
            chars[first:last] = "*" * (last - first)
        return "".join(chars)

    def _hold(self, buf: builtins.bytes, scanner: _Scanner) -> int:
        """Length of the longest suffix of ``buf`` that is a proper prefix of some pattern.

        ``buf`` must hold at least the last ``max_len - 1`` bytes of the stream, or all of it.
        """
        n = len(buf)
        lo = max(0, n - self.max_len + 1)
        best = 0
        if n - lo >= LEAD:
            for lead_id, at in scanner.leads(buf[lo:]):
                start = lo + at
                if n - start > best:
                    rest = buf[start:]
                    for pattern in self._lead_groups[lead_id]:
                        if len(pattern) > len(rest) and pattern.startswith(rest):
                            best = n - start
                            break
            if best:
                return best
        tail = buf[-(LEAD - 1) :]
        short = self._short
        for i in range(len(tail)):
            if tail[i:] in short:
                return len(tail) - i
        return 0


class StreamRedactor:
    """Masks a stream fed in chunks of any size; see the module docstring.

    ``feed`` returns what can be released now; ``flush`` returns the held-back rest at the
    end of the stream. Concatenated, the outputs are exactly as long as the input.
    """

    __slots__ = ("_held", "_held_out", "_hold", "_max_len", "_scanner")

    def __init__(self, redactor: Redactor) -> None:
        engine = redactor._engine
        self._scanner = None if engine is None else engine.scanner()
        self._hold = redactor._hold
        self._max_len = redactor.max_len
        self._held = b""  # raw bytes held back, rescanned with the next chunk
        self._held_out: bytes | None = None  # their masked form, when it differs

    def feed_pieces(self, data: bytes) -> list[builtins.bytes | memoryview]:
        """:meth:`feed`, with the released bytes as pieces in order (joined, they are what
        :meth:`feed` returns). The usual case, a chunk with no match, copies nothing of the
        chunk: the pieces are the held-back tail and a view of the chunk.
        """
        scanner = self._scanner
        if scanner is None:
            return [data] if data else []
        held = self._held
        reach = self._max_len - 1
        if (
            not data
            or self._held_out is not None
            or len(data) < reach
            or scanner.spans(data)
            or (held and scanner.spans(held + data[:reach]))
        ):
            released = self.feed(data)  # matches to mask (rare), or a tiny chunk
            return [released] if released else []
        keep = len(data) - self._hold(data, scanner)
        pieces: list[builtins.bytes | memoryview] = [held] if held else []
        if keep:
            pieces.append(memoryview(data)[:keep] if keep < len(data) else data)
        self._held = data[keep:]
        return pieces

    def feed(self, data: bytes) -> bytes:
        scanner = self._scanner
        if scanner is None:
            return data
        if not data:
            return b""
        held = self._held
        buf = held + data if held else bytes(data)  # bytes(b) is b itself
        n = len(buf)
        spans = scanner.spans(buf)
        keep = n - self._hold(buf, scanner)
        if spans or self._held_out is not None:
            out = bytearray(buf)
            if self._held_out is not None:
                # Matches that ended inside the held tail were masked last time; the rescan,
                # without the bytes before the tail, cannot find them again.
                out[: len(held)] = self._held_out
            _mask(out, spans)
            released = bytes(out[:keep])
            held_out = bytes(out[keep:])
            self._held_out = held_out if held_out != buf[keep:] else None
        else:
            released = buf[:keep] if keep < n else buf
        self._held = buf[keep:]
        return released

    def flush(self) -> bytes:
        """The held-back tail (masked where a match covered it); the stream can go on after."""
        out = self._held if self._held_out is None else self._held_out
        self._held = b""
        self._held_out = None
        return out
