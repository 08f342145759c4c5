"""Finishing: a command's end, noticed at once, recorded, and made durable.

An exec's end is learnt from its supervisor: the ``done`` socket a zygote-forked one closes,
a pidfd on any other, or the daemon's poll (:meth:`Exits.check_running`) where neither
exists. File operations and cancels are finished by the starter. Either way the result is
redacted, journaled, woken up for the sender, and only then fsync'd
(:meth:`Exits._finish_result`): a result is never lost, and never waits for a disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from dataclasses import replace

from endpointd import wire
from endpointd.commands.fileops import OpResult
from endpointd.commands.sender import Sender
from endpointd.commands.state import Active, finished
from endpointd.harness import stores
from endpointd.process.executor import pid_alive
from endpointd.secrets import delivery
from endpointd.spool import ExitStatus, output_total
from superagent_shared.messages import Finished, HarnessExec, Refused, Result

log = logging.getLogger(__name__)

UNKNOWN_OUTCOME = "endpointd restarted while the command was running; outcome unknown"


class Exits(Sender):
    """Finishing, on sending."""

    def _finish_result(self, active: Active, result: Result, *, total: int) -> None:
        if active.delivery is not None:
            active.delivery.close()
            active.delivery = None
        if active.kind == "exec":
            # The supervisor removes the files it was given; this catches one that was killed
            # (or a daemon restarted meanwhile, which has no Prepared to close).
            delivery.remove(active.spool)
        if active.command is not None and isinstance(active.command.op, HarnessExec):
            self._harness_finished(active.command_id)
        if isinstance(result, Finished) and result.error:
            result = replace(result, error=self.redact_text(result.error))
        elif isinstance(result, Refused):
            result = replace(result, message=self.redact_text(result.message))
        # Committed at once, made durable just after the writer has been woken to send it.
        self.journal.finish(active.command_id, wire.encode_result(result), durable=False)
        active.state = "finished"
        active.result = result
        active.result_sent = False
        active.total = total
        self.wake.set()
        self._sync_journal_soon()  # after wake.set(): queued behind the writer's wake-up
        self._publish()
        if isinstance(result, Finished):
            f = result
            log.info(
                "finished %s: exit %d signal %d%s%s",
                active.command_id,
                f.exit_code,
                f.signal,
                " (timed out)" if f.timed_out else "",
                f" error: {f.error}" if f.error else "",
            )

    def _harness_finished(self, command_id: str) -> None:
        """A harness run ended: its session store is kept for a resume, or goes now
        (``[harness] keep_sessions_hours``; :mod:`endpointd.harness.stores`), as do the
        other stores no longer kept."""
        rules = self.policy.rules
        keep = rules.harness.keep_sessions_hours if rules is not None else 0
        try:
            stores.finish(self.state_directory, command_id, keep_hours=keep)
            stores.sweep(
                self.state_directory,
                keep_hours=keep,
                max_run_seconds=min(
                    self.limits.max_timeout_seconds, self.policy.limits.max_runtime_seconds
                ),
            )
        except OSError as exc:
            log.warning("cannot release the session store of %s: %s", command_id, exc)

    def _sync_journal_soon(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.journal.sync()
            return
        if not self._sync_scheduled:
            self._sync_scheduled = True
            # call_soon runs after the callbacks already queued, the writer's wake-up among
            # them: the result goes out first, then the fsync.
            loop.call_soon(self._sync_journal)

    def _sync_journal(self) -> None:
        self._sync_scheduled = False
        try:
            self.journal.sync()
        except OSError:
            log.exception("could not fsync the journal")

    def _elapsed(self, active: Active) -> float:
        return time.monotonic() - active.started_mono if active.started_mono else 0.0

    def _finish_op(self, active: Active, result: OpResult, *, total: int) -> None:
        self._finish_result(
            active,
            finished(
                active.command_id,
                exit_code=result.exit_code,
                error=result.error,
                total=total,
                seconds=self._elapsed(active),
                truncated=result.truncated,
            ),
            total=total,
        )

    def _watch_exit(self, active: Active) -> None:
        """Learn of the end the moment it happens (status.json is written first).

        A zygote-forked supervisor closes its ``done`` socket as soon as it has recorded the
        outcome; any other is watched for its exit through a pidfd. Without either (not
        Linux, kernel < 5.3, no running loop) the monitor's poll does it.
        """
        if active.pid is None or active.command_id in self._pidfds:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if active.done is not None:
            try:
                loop.add_reader(active.done.fileno(), self._on_done_closed, active.command_id)
                return
            except (OSError, ValueError, NotImplementedError):
                active.done.close()
                active.done = None
        pidfd_open = getattr(os, "pidfd_open", None)
        if pidfd_open is None:
            return
        try:
            fd = pidfd_open(active.pid)
        except ProcessLookupError:
            # Already exited (a forked supervisor is not our child, so no zombie keeps its
            # pid): it wrote status.json first, so look now rather than at the next poll.
            loop.call_soon(self._on_supervisor_exit, active.command_id)
            return
        except OSError:
            return  # not supported here: the poll finds out
        try:
            loop.add_reader(fd, self._on_supervisor_exit, active.command_id)
        except (OSError, ValueError, NotImplementedError):
            os.close(fd)
            return
        self._pidfds[active.command_id] = fd

    def _unwatch_exit(self, command_id: str) -> None:
        active = self.commands.get(command_id)
        if active is not None and active.done is not None:
            with contextlib.suppress(RuntimeError, OSError, ValueError):
                asyncio.get_running_loop().remove_reader(active.done.fileno())
            active.done.close()
            active.done = None
        fd = self._pidfds.pop(command_id, None)
        if fd is None:
            return
        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop().remove_reader(fd)
        os.close(fd)

    def _on_done_closed(self, command_id: str) -> None:
        self._unwatch_exit(command_id)
        if self.zygote is not None:
            self.zygote.replenish()
        active = self.commands.get(command_id)
        if active is None:
            return
        self._check_exec(active)
        if active.state == "running":
            # It closed the socket without an outcome (it found its claim taken, or died):
            # its exit decides, through a pidfd or the poll.
            self._watch_exit(active)

    def _on_supervisor_exit(self, command_id: str) -> None:
        self._unwatch_exit(command_id)
        active = self.commands.get(command_id)
        if active is not None:
            self._check_exec(active)

    def _release_child(self, active: Active) -> None:
        self._unwatch_exit(active.command_id)
        proc = self.children.pop(active.command_id, None)
        if proc is not None and proc.poll() is None:
            self._exiting.append(proc)

    def _finish_exec(self, active: Active, status: ExitStatus) -> None:
        self._release_child(active)
        seconds = (
            status.finished_at - status.started_at if status.started_at else self._elapsed(active)
        )
        error = status.error
        if status.timed_out and not error:
            error = "timed out"
        total, truncated = self._capped(active, status.total_output_bytes)
        result = finished(
            active.command_id,
            exit_code=status.exit_code,
            error=error,
            signal=status.signal,
            total=total,
            seconds=seconds,
            timed_out=status.timed_out,
            truncated=truncated,
        )
        self._finish_result(active, result, total=total)

    def _capped(self, active: Active, total: int) -> tuple[int, bool]:
        """The output size reported, within the policy's max output (and whether cut)."""
        cap = active.max_output if active.max_output is not None else total
        if total > cap:
            log.info(
                "%s: output cut at %d of %d bytes (policy limit)", active.command_id, cap, total
            )
            return cap, True
        return total, False

    def _finish_unknown(self, active: Active) -> None:
        self._release_child(active)
        total, truncated = self._capped(active, output_total(active.spool))
        log.warning("%s: %s", active.command_id, UNKNOWN_OUTCOME)
        result = finished(
            active.command_id,
            exit_code=-1,
            error=UNKNOWN_OUTCOME,
            total=total,
            seconds=0,
            truncated=truncated,
        )
        self._finish_result(active, result, total=total)

    def check_running(self) -> None:
        self._exiting = [p for p in self._exiting if p.poll() is None]
        for active in list(self.commands.values()):
            try:
                self._check_exec(active)
            except Exception as exc:
                # One command whose end cannot be read (a status file that does not parse)
                # fails alone: raised here, it would end the monitor and the daemon with it.
                log.exception("%s: cannot follow it", active.command_id)
                self._finish_unfollowable(active, exc)

    def _finish_unfollowable(self, active: Active, exc: Exception) -> None:
        """Finish ``active`` with why its outcome cannot be known; its output is kept."""
        error = (
            f"endpointd could not follow this command ({type(exc).__name__}: {exc});"
            " its outcome is unknown"
        )
        try:
            total, truncated = self._capped(active, output_total(active.spool))
        except Exception:
            total, truncated = active.sent, True
        try:
            self._release_child(active)
            result = finished(
                active.command_id,
                exit_code=-1,
                error=error,
                total=total,
                seconds=self._elapsed(active),
                truncated=truncated,
            )
            self._finish_result(active, result, total=total)
        except Exception:
            log.exception("%s: cannot record its end", active.command_id)
            active.state = "finished"  # never looked at again by this loop

    def _check_exec(self, active: Active) -> None:
        """Finish a running exec whose supervisor is done; notice new output otherwise."""
        if active.state != "running" or active.kind != "exec" or active.local_task:
            return
        if active.launching:
            return  # no pid yet: nothing to check
        status = ExitStatus.read(active.spool)
        if status is not None:
            self._finish_exec(active, status)
            return
        proc = self.children.get(active.command_id)
        if proc is not None:
            alive = proc.poll() is None  # also reaps our own exited supervisors
        else:
            alive = active.pid is not None and pid_alive(active.pid)
        if not alive:
            status = ExitStatus.read(active.spool)  # it may have written just before exit
            if status is not None:
                self._finish_exec(active, status)
            else:
                self._finish_unknown(active)
            return
        size = (active.reader or self._reader(active)).size_hint()
        if size != active.last_size:
            active.last_size = size
            self.wake.set()

    def flush_acks(self) -> None:
        # Acked offsets are an optimisation (less to resend), so they are written lazily.
        for active in self.commands.values():
            if active.acked_dirty:
                self.journal.set_acked_offset(active.command_id, active.acked)
                active.acked_dirty = False
