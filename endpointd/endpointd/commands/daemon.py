"""The daemon's command state machine: journal, start in order, track, report, forget.

This module owns what happens to a command between the server sending it and the server
acknowledging its result; the network side (handshake, heartbeats, reconnects) is in
``connection``. The two meet in three places: :meth:`Daemon.handle_server_message` for
everything received, :meth:`Daemon.next_output_message` for output and results to send, and
:meth:`Daemon.on_connected` to rewind what was sent but not acknowledged.

Lifecycle of a command (journal state in brackets)::

    received ─ invalid/expired/denied ─────────────────────────▶ Refused  [finished]
        │
        ▼ journaled + Accepted sent                              [accepted]
    started in seq order (expired by then → Refused)             [running]
        │ exec: supervisor detached; file op: worker thread
        ▼ status recorded
    Finished                                                     [finished]
        │ Ack.finished from the server
        ▼ spool deleted, row compacted for dedupe               [acked]

Output and results are resent after every reconnect from the acknowledged offset until the
server acknowledges them; nothing is ever started twice.

The parts, one module each, are layers: each a class on the one below, so a part may call
those under it and none above (the reverse would be an import cycle)::

    Daemon   daemon.py   the whole: the monitor loop (polls, ack flushes, pruning), close()
    Intake   intake.py   receiving commands and acks; recovery from the journal
    Starter  starter.py  starting: policy again, approvals, credentials, sandbox, launch
    Exits    exits.py    finishing: exits noticed, results recorded, the journal synced
    Sender   sender.py   sending: control messages, output redacted on its way out
    Core     state.py    the shared state (Active, the journal, the policy…), the
                         redactor, status.json
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from endpointd.commands.intake import Intake
from endpointd.commands.state import Active

__all__ = ["Active", "Daemon"]

# Output of running execs is polled at this interval. Their end is an event where the OS
# offers one (a pidfd on each supervisor, Linux >= 5.3) and this poll otherwise, which also
# stays on as the safety net.
MONITOR_INTERVAL = 0.05
ACK_FLUSH_INTERVAL = 1.0
PRUNE_INTERVAL = 3600.0


class Daemon(Intake):
    """The command state machine, whole: what the runner starts and the connection feeds."""

    async def monitor(self) -> None:
        """Poll running execs for new output and for their end; flush acked offsets."""
        while True:
            self.check_running()
            now = time.monotonic()
            if now - self._last_ack_flush >= ACK_FLUSH_INTERVAL:
                self.flush_acks()
                self._last_ack_flush = now
            if now - self._last_prune >= PRUNE_INTERVAL:
                # A daemon that runs for weeks must still forget old dedupe records.
                self.journal.prune()
                self._last_prune = now
            await asyncio.sleep(MONITOR_INTERVAL)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.journal.sync()
        if self._publish_timer is not None:
            self._publish_timer.cancel()
            self._publish_now()
        if self.zygote is not None:
            self.zygote.stop()
        for command_id in {*self._pidfds, *self.commands}:
            self._unwatch_exit(command_id)
        self.flush_acks()
        for active in self.commands.values():
            if active.reader is not None:
                active.reader.close()
