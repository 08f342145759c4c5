"""Sending: what goes to the server, and command output masked on its way out.

Control messages (Accepted, AwaitingApproval, the Refused of a command with nothing to
journal it under) are queued for the connection's writer (:meth:`Sender._send`); output and
results are pulled by it (:meth:`Sender.next_output_message`), read from the spools and
passed through the redactor here, so no byte leaves unmasked. After a reconnect everything
not acknowledged is sent again, from the acknowledged offsets (:meth:`Sender.on_connected`).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

from endpointd import wire
from endpointd.commands.state import Active, Core, Redacting
from endpointd.journal import State
from endpointd.spool import SpoolReader
from superagent_shared.messages import Finished, InFlight, InFlightState
from superagent_shared.protocol import MAX_OUTPUT_CHUNK_BYTES

log = logging.getLogger(__name__)

_IN_FLIGHT: dict[State, InFlightState] = {
    "accepted": InFlightState.ACCEPTED,
    "running": InFlightState.RUNNING,
    "finished": InFlightState.FINISHED,
}


class Sender(Core):
    """Sending, on the shared state."""

    def _send(self, message: wire.Outgoing) -> None:
        if self.control is None:
            log.debug("not connected; dropping %s", wire.kind_of(message))
            return
        self.control.put_nowait(message)
        self.wake.set()

    def _send_awaiting(self, active: Active, deadline: float) -> None:
        self._send(wire.awaiting_approval(active.command_id, active.approval_rule or "", deadline))

    def _reader(self, active: Active) -> SpoolReader:
        if active.reader is None:
            active.reader = SpoolReader(active.spool)
        return active.reader

    def in_flight(self) -> list[InFlight]:
        return [
            InFlight(
                command_id=a.command_id,
                acked_output_offset=a.acked,
                state=InFlightState.AWAITING_APPROVAL
                if a.approval_deadline is not None
                else _IN_FLIGHT[a.state],
            )
            for a in sorted(self.commands.values(), key=lambda a: a.seq)
        ]

    def on_connected(self, control: asyncio.Queue[wire.Outgoing]) -> None:
        """A new stream: resend everything not acknowledged, from the acked offsets."""
        self.control = control
        for active in self.commands.values():
            active.sent = active.acked
            active.result_sent = False
            if active.approval_deadline is not None:
                self._send_awaiting(active, active.approval_deadline)
        self.wake.set()

    def on_disconnected(self) -> None:
        self.control = None

    def next_output_message(self) -> wire.Outgoing | None:
        """The next OutputChunk or result to send on the current stream, if any.

        A command whose output cannot be read or sent (a spool that fails) fails alone: its
        output ends where it could be read, its result says why, and the others go on. An
        exception here would end the stream, and every new one would meet it again."""
        for active in sorted(self.commands.values(), key=lambda a: a.seq):
            try:
                message = self._next_of(active)
            except Exception as exc:
                log.exception("%s: cannot send its output", active.command_id)
                self._unsendable(active, exc)
                continue
            if message is not None:
                return message
        return None

    def _unsendable(self, active: Active, exc: Exception) -> None:
        """Cut ``active``'s output where it stopped, and say so in its result (once it has
        one; until then it is skipped)."""
        result = active.result
        if not isinstance(result, Finished):
            return
        why = f"endpointd could not send the output past byte {active.sent}: {exc}"
        active.total = active.sent
        active.result = replace(
            result,
            total_output_bytes=active.sent,
            output_truncated=True,
            error=f"{result.error}; {why}" if result.error else why,
        )
        active.result_sent = False
        self.journal.finish(active.command_id, wire.encode_result(active.result), durable=False)

    def _next_of(self, active: Active) -> wire.Outgoing | None:
        """The next message of ``active``'s (output, then its result), if any."""
        end = active.total if active.total is not None else active.max_output
        if active.has_output and (end is None or active.sent < end):
            got = self._redacted_output(active)
            if got is not None:
                stream, data = got
                if end is not None:
                    data = data[: end - active.sent]
                chunk = wire.output(active.command_id, stream, active.sent, data)
                active.sent += len(data)
                return chunk
            if active.total is not None and self._spool_exhausted(active):
                log.error(
                    "%s: spool has no output at %d of %d; skipping to the result",
                    active.command_id,
                    active.sent,
                    active.total,
                )
                active.sent = active.total
        if (
            active.result is not None
            and not active.result_sent
            and (active.total is None or active.sent >= active.total)
        ):
            active.result_sent = True
            return wire.result(active.result)
        return None

    def _spool_exhausted(self, active: Active) -> bool:
        red = active.redacting
        return red is not None and red.raw_pos >= active.sent and not red.ready

    def _redacted_output(self, active: Active) -> tuple[int, bytes] | None:
        """Masked output of one stream from ``active.sent`` on, or None if none is ready.

        Reads the spool until a full chunk is ready (or nothing more is there), so chunks are
        as large as before redaction. A resend from an earlier offset (a reconnect) re-reads
        the spool from the start, so a secret straddling the resend point is still found.
        """
        red = active.redacting
        if red is None or active.sent < (red.ready[0][1] if red.ready else red.released):
            redactor = self.redactor()
            red = active.redacting = Redacting(
                redactor.stream(),
                read_size=MAX_OUTPUT_CHUNK_BYTES * (1 if redactor.engine == "none" else 4),
            )
        reader = self._reader(active)
        while True:
            while red.ready and red.ready[0][1] + len(red.ready[0][2]) <= active.sent:
                red.ready.popleft()
            if red.ready and (
                red.released - active.sent >= MAX_OUTPUT_CHUNK_BYTES
                or red.ready[-1][0] != red.ready[0][0]  # a full run of one stream
            ):
                return self._take(red, active.sent)
            got = reader.read(red.raw_pos, red.read_size)
            if got is None:
                done = active.total is not None and red.raw_pos >= active.total
                if done and red.stream is not None:
                    self._release(red, red.stream, red.redactor.flush())
                    red.stream = None
                    continue
                return self._take(red, active.sent) if red.ready else None
            raw_stream, raw = got
            if red.stream is not None and raw_stream != red.stream:
                # Another stream's bytes follow: what was held of this one ends here.
                self._release(red, red.stream, red.redactor.flush())
            red.stream = raw_stream
            red.raw_pos += len(raw)
            for piece in red.redactor.feed_pieces(raw):
                self._release(red, raw_stream, piece)

    @staticmethod
    def _take(red: Redacting, sent: int) -> tuple[int, bytes]:
        """Up to a chunk of ready bytes of one stream from ``sent`` (not removed)."""
        stream, offset, first = red.ready[0]
        start = sent - offset
        whole = start == 0 and isinstance(first, bytes)
        if whole and (len(first) == MAX_OUTPUT_CHUNK_BYTES or len(red.ready) == 1):
            return stream, bytes(first[:MAX_OUTPUT_CHUNK_BYTES])  # as read: no copy
        parts: list[bytes | memoryview] = []
        size = 0
        for seg_stream, seg_offset, data in red.ready:
            if seg_stream != stream or size >= MAX_OUTPUT_CHUNK_BYTES:
                break
            part = data[max(sent - seg_offset, 0) :]
            parts.append(part[: MAX_OUTPUT_CHUNK_BYTES - size])
            size += len(parts[-1])
        return stream, b"".join(parts)

    @staticmethod
    def _release(red: Redacting, stream: int, data: bytes | memoryview) -> None:
        if data:
            red.ready.append((stream, red.released, data))
            red.released += len(data)
