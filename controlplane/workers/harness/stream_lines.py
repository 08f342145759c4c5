"""Framing a harness's output into JSON objects: the part every harness parser shares.

The output arrives as bytes cut anywhere (a job's output chunks), with stray lines from
stderr between the JSON lines and possibly no newline at the end. :class:`JsonLinesParser`
keeps a partial line for the next :meth:`~JsonLinesParser.feed`, hands each JSON object to
its subclass's :meth:`~JsonLinesParser.decode`, and turns everything else into ``note``
events. It never raises: a line over :data:`MAX_LINE_BYTES` is dropped with one note (no
more than the cap is ever held), an object a subclass cannot read becomes a note, and the
next line is parsed as if nothing happened, so one bad line never costs the rest of a run.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from controlplane.workers.harness.stream_events import NOTE_CHARS, HarnessEvent, cap

__all__ = ["MAX_LINE_BYTES", "JsonLinesParser"]

log = logging.getLogger(__name__)

MAX_LINE_BYTES = 1 << 20  # a longer line is dropped: a harness event is far smaller


class JsonLinesParser:
    """Incremental JSON-lines framing; subclasses implement :meth:`decode`."""

    harness = "harness"

    def __init__(self, *, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self.max_line_bytes = max_line_bytes
        self._partial = bytearray()
        self._dropping = False  # inside a line over the cap: skip to its newline

    def feed(self, data: bytes) -> list[HarnessEvent]:
        """The events of every line ``data`` completes; a partial line waits for more."""
        events: list[HarnessEvent] = []
        start = 0
        while start < len(data):
            end = data.find(b"\n", start)
            piece = data[start:] if end < 0 else data[start:end]
            if self._dropping:
                pass
            elif len(self._partial) + len(piece) > self.max_line_bytes:
                self._partial.clear()
                self._dropping = True
                events.append(self._note(f"dropped a line over {self.max_line_bytes} bytes"))
            else:
                self._partial += piece
            if end < 0:
                break
            if not self._dropping:
                events.extend(self._line(bytes(self._partial)))
            self._partial.clear()
            self._dropping = False
            start = end + 1
        return events

    def finish(self) -> list[HarnessEvent]:
        """The last line (output need not end with a newline), and whatever a subclass
        still holds."""
        events: list[HarnessEvent] = []
        if self._partial and not self._dropping:
            events.extend(self._line(bytes(self._partial)))
        self._partial.clear()
        self._dropping = False
        events.extend(self._guarded(self.flush))
        return events

    def decode(self, obj: dict[str, Any]) -> list[HarnessEvent]:
        """The events of one JSON object of the stream."""
        raise NotImplementedError

    def flush(self) -> list[HarnessEvent]:
        """Events held back until the end of the output (none by default)."""
        return []

    def _line(self, raw: bytes) -> list[HarnessEvent]:
        text = raw.decode("utf-8", errors="replace").strip()
        if not text:
            return []
        if not text.startswith("{"):
            return [self._note(text)]
        try:
            obj = json.loads(text)
        except (ValueError, RecursionError):
            return [self._note(f"malformed JSON: {text}")]
        if not isinstance(obj, dict):
            return [self._note(text)]
        return self._guarded(lambda: self.decode(obj))

    def _guarded(self, step: Any) -> list[HarnessEvent]:
        # A shape no version of the harness printed must not end the parse: the round
        # keeps reading the run, and the note says what was skipped.
        try:
            events: list[HarnessEvent] = step()
        except Exception as exc:  # one bad event is that event's problem, never the run's
            log.debug("%s: unreadable event", self.harness, exc_info=True)
            return [self._note(f"unreadable {self.harness} event ({type(exc).__name__})")]
        return events

    @staticmethod
    def _note(text: str) -> HarnessEvent:
        return HarnessEvent("note", text=cap(text, NOTE_CHARS))
