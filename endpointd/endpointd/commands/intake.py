"""Receiving: commands and acknowledgements from the server, and the journal after a restart.

A command is checked (validation, ``not_after``, the policy, its credential references) and
journaled before anything else happens to it: a refused one as finished, the others as
accepted, or at once as running when the starter takes it next. One that cannot be judged
(a check raises: a path no one may resolve, say) is refused as any other, with the reason;
one that cannot even be read or journaled is refused without a record. Either way the
server gets its answer and delivers it no more, and no message ends the stream. A
redelivery is answered from the journal and never run again. An Ack moves the point output
is resent from, and lets a result go. After a restart (:meth:`Intake.recover`) the journal
is the memory: queued commands are queued again, running execs re-attached or, gone,
finished as unknown.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import time
from dataclasses import replace

from endpointd import wire
from endpointd.commands.starter import Starter
from endpointd.commands.state import Active, finished, refused
from endpointd.guard.validation import validate
from endpointd.harness import runs
from endpointd.journal import Entry
from endpointd.process.executor import pid_alive
from endpointd.rules.decisions import Decision, Refusal
from endpointd.secrets import delivery
from endpointd.spool import SUPERVISOR_PID_FILE, ExitStatus, read_pid, remove_spool, spool_dir
from superagent_shared.messages import Ack, Challenge, Command, Finished, Reason, RunHarness

log = logging.getLogger(__name__)

# The id of the command being judged, in the state dir: what a daemon that died while
# judging one (a crash no handler catches) leaves for the next, which then refuses that one
# command when it is delivered again instead of dying on it once more.
JUDGING_FILE = "judging"


class Intake(Starter):
    """Receiving and recovery, on starting."""

    _judging_fd: int | None = None
    _died_judging: frozenset[str] = frozenset()

    # ------------------------------------------------------------------ recovery

    def recover(self) -> None:
        """Rebuild the in-memory view from the journal after a (re)start."""
        # A new key for this boot: answers given to a previous daemon are void, and only
        # someone who can read the state dir (the owner, never a sandboxed command) can
        # make new ones.
        self.approvals.renew_key()
        self._open_judging()
        pruned = self.journal.prune()
        if pruned:
            log.info("pruned %d acknowledged command records", pruned)
        for entry in self.journal.active():
            # One journaled command the daemon cannot take up again (a body that no longer
            # reads, a harness that no longer builds, a spool that fails) is that command's
            # failure, never the daemon's: an exception here would stop every start.
            try:
                active = self._from_entry(entry)
            except Exception as exc:
                log.exception("cannot resume %s", entry.command_id)
                active = self._stand_in(entry)
                self.commands[active.command_id] = active
                self._unresumable(active, exc)
                continue
            self.commands[active.command_id] = active
            try:
                if active.state == "accepted":
                    self._queue_start(active)
                elif active.state == "running":
                    self._reattach(active)
            except Exception as exc:
                log.exception("cannot resume %s", entry.command_id)
                self._unresumable(active, exc)
        if self.commands:
            log.info("resuming %d journaled command(s)", len(self.commands))
        self._publish()

    def _stand_in(self, entry: Entry) -> Active:
        """An entry whose command cannot be read back: its id and place, no command."""
        return Active(
            command_id=entry.command_id,
            seq=entry.seq,
            command=None,
            state=entry.state,
            spool=spool_dir(self.state_directory, entry.command_id),
            acked=entry.acked_offset,
            sent=entry.acked_offset,
        )

    def _unresumable(self, active: Active, exc: Exception) -> None:
        """Finish ``active``, which this daemon cannot take up again, saying why."""
        if active.state == "finished" and active.result is not None:
            return  # its result stands; it is only to be sent
        error = (
            "endpointd could not take this command up again after a restart"
            f" ({type(exc).__name__}: {exc}); if it had started, its outcome is unknown"
        )
        total = active.sent
        result = finished(active.command_id, exit_code=-1, error=error, total=total, seconds=0)
        self._finish_result(active, result, total=total)

    def _open_judging(self) -> None:
        """Read what the previous daemon was judging when it stopped, and keep the file
        open for this one (two small writes per command, no fsync: it must outlive a
        crash of the process, not of the machine)."""
        path = self.state_directory / JUDGING_FILE
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            log.warning("cannot open %s: %s", path, exc)
            return
        try:
            left = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
            os.ftruncate(fd, 0)
        except OSError as exc:
            log.warning("cannot read %s: %s", path, exc)
            left = ""
        if left:
            log.error("the previous endpointd stopped while judging %s; it will be refused", left)
            self._died_judging = frozenset({left})
        self._judging_fd = fd

    def _mark_judging(self, command_id: str) -> None:
        fd = self._judging_fd
        if fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            if command_id:
                os.pwrite(fd, command_id.encode("utf-8", "replace"), 0)

    def _from_entry(self, entry: Entry) -> Active:
        command = wire.decode_command(entry.body) if entry.body is not None else None
        if command is not None and isinstance(command.op, RunHarness) and entry.state != "finished":
            # The journal keeps the request; what runs is built by this device. One that can
            # no longer be built keeps a stand-in: re-attached if it still runs, refused at
            # its start otherwise (it is built again there).
            built = self._build_harness(command)
            command = (
                built
                if isinstance(built, Command)
                else replace(command, op=runs.unplanned(command.op))
            )
        result = wire.decode_result(entry.result) if entry.result is not None else None
        active = Active(
            command_id=entry.command_id,
            seq=entry.seq,
            command=command,
            state=entry.state,
            spool=spool_dir(self.state_directory, entry.command_id),
            acked=entry.acked_offset,
            sent=entry.acked_offset,
            result=result,
            pid=entry.pid,
        )
        if result is not None:
            active.total = result.total_output_bytes if isinstance(result, Finished) else 0
        return active

    def _reattach(self, active: Active) -> None:
        active.max_output = self.policy.limits.max_output_bytes
        status = ExitStatus.read(active.spool)
        if status is not None:
            self._finish_exec(active, status)
            return
        if active.kind != "exec":
            # A file operation interrupted by the crash: it ran in the dead daemon's thread.
            self._finish_unknown(active)
            return
        if active.pid is None:
            active.pid = read_pid(active.spool / SUPERVISOR_PID_FILE)
        if active.pid is None or not pid_alive(active.pid):
            self._finish_unknown(active)
            return
        active.started_mono = time.monotonic()
        self._watch_exit(active)
        log.info(
            "re-attached to running command %s (supervisor pid %d)", active.command_id, active.pid
        )

    # ------------------------------------------------------------------ receiving

    def handle_server_message(self, message: wire.Inbound) -> None:
        """One server message. Never raises: whatever one message does to this daemon (a
        path the policy cannot resolve, a full disk, a bug) is that message's failure, told
        back as its command's result, and never the stream's end (an ended stream is opened
        again and meets the same message: the device would work for no one)."""
        try:
            if isinstance(message, Command):
                self.handle_command(message)
            elif isinstance(message, wire.Undecodable):
                log.warning("cannot read a server message: %s", message.error)
                if not message.command_id:
                    return  # not a command (or one without an id): nothing to answer
                self._refuse_unjournaled(
                    message.command_id,
                    Refusal(
                        Reason.INVALID, f"endpointd could not read this command: {message.error}"
                    ),
                    "undecodable",
                )
            elif isinstance(message, Ack):
                self.handle_ack(message)
            elif isinstance(message, Challenge):
                log.warning("ignoring an unexpected second Challenge on the stream")
        except Exception as exc:
            log.exception("handling a %s failed", wire.kind_of(message))
            if isinstance(message, Command) and message.command_id not in self.commands:
                self._refuse_unjournaled(
                    message.command_id,
                    Refusal(
                        Reason.POLICY_DENIED,
                        f"endpointd could not take this command: {type(exc).__name__}: {exc}",
                    ),
                    "intake",
                )

    def _refuse_unjournaled(self, command_id: str, refusal: Refusal, rule: str) -> None:
        """Refuse a command that could not be journaled: the answer is sent, so the server
        records the refusal and delivers it no more; a redelivery meanwhile is refused
        again the same way."""
        refusal = Refusal(refusal.reason, wire.utf8_text(self.redact_text(refusal.message)))
        with contextlib.suppress(Exception):  # the answer matters more than the record
            self.audit.record("refused", command_id, rule, refusal.message)
        self._send(wire.result(refused(command_id, refusal)))

    def _judge(self, command: Command) -> tuple[Command, Refusal | None, str, Decision | None]:
        """``command`` as it will run (a RunHarness built), and the refusal and its rule, or
        the policy's decision. A check that raises refuses the command, saying why: a
        command the daemon cannot judge is not run."""
        try:
            # A RunHarness becomes the exec this device builds for it before anything
            # judges it: validation and the policy see the real argv.
            built = self._build_harness(command)
            if isinstance(built, Refusal):
                return command, built, "harness", None
            command = self._bind(built)
            refusal = validate(command)
            if refusal is not None:
                return command, refusal, "validation", None
            if self._expired(command):
                expired = Refusal(Reason.EXPIRED, "not_after passed before the command arrived")
                return command, expired, "not_after", None
            outside = self._outside_ticket(command)
            if outside is not None:
                assert outside.refusal is not None
                return command, outside.refusal, outside.rule, outside
            decision = self.policy.check(command)
            if decision.action == "deny":
                assert decision.refusal is not None
                return command, decision.refusal, decision.rule, decision
            if command.credentials:
                try:
                    delivery.check(command.credentials)
                except delivery.DeliveryError as exc:
                    return (
                        command,
                        Refusal(Reason.CREDENTIAL_UNAVAILABLE, str(exc)),
                        "credentials",
                        decision,
                    )
            return command, None, "", decision
        except Exception as exc:
            log.warning("cannot judge %s", command.command_id, exc_info=True)
            return (
                command,
                Refusal(
                    Reason.POLICY_DENIED,
                    "endpointd could not judge this command, so it does not run:"
                    f" {type(exc).__name__}: {exc}",
                ),
                "judging",
                None,
            )

    def handle_command(self, command: Command) -> None:
        body = command.body
        digest = hashlib.sha256(body).digest()
        command_id = command.command_id
        existing = self.journal.get(command_id) if command_id else None
        if existing is not None:
            self._redelivered(command, existing, digest)
            return

        if command_id in self._died_judging:
            # It took the previous daemon down: judged again, it might do so again.
            self._died_judging = self._died_judging - {command_id}
            refusal: Refusal | None = Refusal(
                Reason.POLICY_DENIED,
                "endpointd stopped while judging this command (it crashed or was killed),"
                " so it is not judged again and does not run",
            )
            rule, decision = "judging", None
        else:
            self._mark_judging(command_id)
            try:
                command, refusal, rule, decision = self._judge(command)
            finally:
                self._mark_judging("")
        if refusal is not None:
            refusal = Refusal(refusal.reason, self.redact_text(refusal.message))
            log.info("refusing %s: %s", command_id or "(no id)", refusal.message)
            self.audit.record("refused", command_id, rule, refusal.message)
            result = refused(command_id, refusal)
            if not command_id:
                self._send(wire.result(result))  # nothing to journal it under
                return
            self.journal.insert(
                command_id=command_id,
                seq=command.seq,
                body=body,
                body_sha256=digest,
                state="finished",
                accepted=False,
                result=wire.encode_result(result),
            )
            self.commands[command_id] = Active(
                command_id=command_id,
                seq=command.seq,
                command=command,
                state="finished",
                spool=spool_dir(self.state_directory, command_id),
                result=result,
                total=0,
            )
            self.wake.set()
            return

        # Journaled (fsync'd) before Accepted is sent and before anything runs. A command
        # that the starter will take next (nothing queued ahead of it, the starter idle) is
        # journaled as `running` at once: one fsync instead of two before it starts, and
        # that fsync runs in a thread while a spare gets ready for it (_launch_exec). A
        # crash before it is started is then reported as an unknown outcome, as one between
        # `running` and the start always was; never as a second run.
        asks = decision is not None and decision.action == "ask"
        start_next = (
            self.clock_offset is not None
            and not self._start_heap
            and not self._starting
            and not asks  # it waits for a human: journaled as accepted, never "running"
        )
        self.journal.insert(
            command_id=command_id,
            seq=command.seq,
            body=body,
            body_sha256=digest,
            state="running" if start_next else "accepted",
            accepted=True,
            # One that starts next gets its fsync in a thread, while a spare gets ready.
            durable=not start_next,
        )
        active = Active(
            command_id=command_id,
            seq=command.seq,
            command=command,
            state="accepted",
            spool=spool_dir(self.state_directory, command_id),
            journaled_running=start_next,
        )
        self.commands[command_id] = active
        log.info("accepted %s (seq %d, %s)", command_id, command.seq, active.kind)
        if start_next:
            active.durable = asyncio.get_running_loop().run_in_executor(None, self.journal.sync)
            self._queue_start(active)  # Accepted follows the fsync (_make_durable)
        else:
            self._queue_start(active)
            self._send(wire.accepted(command_id))

    def _redelivered(self, command: Command, existing: Entry, digest: bytes) -> None:
        command_id = command.command_id
        if existing.body_sha256 != digest:
            # Sent once and not journaled: the journal row belongs to the original command.
            log.warning(
                "refusing %s: same id as a journaled command, different content", command_id
            )
            self.audit.record("refused", command_id, "duplicate", "same id as a journaled command")
            refusal = Refusal(
                Reason.DUPLICATE,
                "command_id is already journaled on this device with different content",
            )
            self._send(wire.result(refused(command_id, refusal)))
            return
        log.info("redelivery of %s (%s): replaying, not re-running", command_id, existing.state)
        if existing.accepted:
            self._send(wire.accepted(command_id))
        active = self.commands.get(command_id)
        if active is not None:
            active.sent = min(active.sent, active.acked)
            active.result_sent = False
            self.wake.set()
        elif existing.result is not None:
            # Acknowledged already; the server evidently lost that, so tell it again.
            self._send(wire.result(wire.decode_result(existing.result)))

    def handle_ack(self, ack: Ack) -> None:
        active = self.commands.get(ack.command_id)
        if active is None:
            log.debug("ack for %s, which is not active", ack.command_id)
            return
        offset = ack.acked_output_offset
        if offset < active.acked:
            # The server holds less than it once acknowledged (e.g. restored from backup):
            # resend from where it really is, results included.
            log.warning(
                "%s: server rewound its ack from %d to %d; resending",
                ack.command_id,
                active.acked,
                offset,
            )
            active.sent = min(active.sent, offset)
            active.result_sent = False
        elif offset > active.sent:
            active.sent = offset  # it already has more than this stream sent: skip ahead
        if offset != active.acked:
            active.acked = offset
            active.acked_dirty = True
        if ack.finished:
            if active.result is None:
                log.warning("ignoring Ack.finished for %s: it has not finished", ack.command_id)
            else:
                self._forget(active)
        self.wake.set()

    def _forget(self, active: Active) -> None:
        self.journal.mark_acked(active.command_id, active.acked)
        if active.reader is not None:
            active.reader.close()
        remove_spool(active.spool)
        self.commands.pop(active.command_id, None)
        self._publish()
