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
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import heapq
import logging
import os
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from endpointd.audit import AuditLog
from endpointd.commands.fileops import OpResult, list_dir, read_file, write_file
from endpointd.config import DeviceConfig
from endpointd.guard import sandbox
from endpointd.guard.approvals import Approvals, describe, summarize
from endpointd.guard.confinement import Confinement
from endpointd.guard.policy import Decision, Policy, Refusal
from endpointd.guard.validation import validate
from endpointd.journal import Entry, Journal, State
from endpointd.process.executor import (
    ExecLimits,
    Zygote,
    ZygoteError,
    exec_spec,
    go,
    pid_alive,
    private_tmpdir,
    request_cancel,
    revoke_or_adopt,
    start_supervisor,
)
from endpointd.secrets import delivery, own_secrets
from endpointd.secrets.ca import device_ca
from endpointd.secrets.proxy import Egress
from endpointd.secrets.redact import Redactor, StreamRedactor
from endpointd.secrets.store import CredentialError, CredentialStore
from endpointd.spool import (
    SUPERVISOR_PID_FILE,
    ExitStatus,
    SpoolReader,
    SpoolWriter,
    output_total,
    read_pid,
    remove_spool,
    spool_dir,
)
from endpointd.status import StatusReporter
from superagent_proto.v1 import endpoint_pb2 as pb
from superagent_shared.protocol import MAX_OUTPUT_CHUNK_BYTES

log = logging.getLogger(__name__)

UNKNOWN_OUTCOME = "endpointd restarted while the command was running; outcome unknown"
# Output of running execs is polled at this interval. Their end is an event where the OS
# offers one (a pidfd on each supervisor, Linux >= 5.3) and this poll otherwise, which also
# stays on as the safety net.
MONITOR_INTERVAL = 0.05
ACK_FLUSH_INTERVAL = 1.0
# status.json (for `endpointd status`) trails the daemon's state by at most this much.
PUBLISH_DELAY = 0.1
PRUNE_INTERVAL = 3600.0
# How often the credential store is checked for changes (a new credential is masked from then).
REDACTOR_RECHECK = 0.05
# Clock offsets beyond this are worth a warning: not_after decisions are made in server time.
SKEW_WARNING_SECONDS = 30.0

_STATE_TO_WIRE: dict[State, pb.InFlight.State.ValueType] = {
    "accepted": pb.InFlight.STATE_ACCEPTED,
    "running": pb.InFlight.STATE_RUNNING,
    "finished": pb.InFlight.STATE_FINISHED,
}


@dataclass(eq=False)
class Redacting:
    """A command's output on its way out: read from the spool, masked, queued to send.

    Masking is same-length, so the offsets of what is sent are the spool's. Only the bytes
    that might begin a secret are held back, until more output (or the end) decides.
    """

    redactor: StreamRedactor
    # Spool bytes read per step: with credentials to find, several chunks' worth, so the
    # scan and the seam handling (a held-back tail) happen once per several chunks sent.
    read_size: int = MAX_OUTPUT_CHUNK_BYTES
    raw_pos: int = 0  # spool offset read so far
    stream: int | None = None  # the stream the redactor is inside
    # Masked bytes ready to send, in order: (stream, offset, data); views of what was read
    # where nothing was masked, so a chunk is copied once, when it is assembled.
    ready: collections.deque[tuple[int, int, bytes | memoryview]] = field(
        default_factory=collections.deque
    )
    released: int = 0  # offset just past the last byte put in `ready`


@dataclass(eq=False)
class Active:
    """A journaled command the server has not fully acknowledged yet."""

    command_id: str
    seq: int
    command: pb.Command | None
    state: State
    spool: Path
    acked: int = 0
    # Next offset to send on the current stream; rewound to `acked` on every (re)connect.
    sent: int = 0
    result: pb.DeviceMessage | None = None
    result_sent: bool = False
    total: int | None = None  # final output size, known once finished
    pid: int | None = None  # exec supervisor
    started_mono: float | None = None
    reader: SpoolReader | None = None
    last_size: int = 0
    acked_dirty: bool = False
    local_task: bool = False  # a file op running in this daemon's thread pool
    # Between `running` and knowing the supervisor's pid (the zygote's reply is awaited).
    launching: bool = False
    # A zygote-forked supervisor closes this once it has recorded the outcome (see _zygote).
    done: socket.socket | None = None
    # Journaled as `running` on receipt (it was next to start), so _start need not.
    journaled_running: bool = False
    # The fsync that makes the journal row durable, running in a thread; Accepted is sent,
    # and the command started, only once it is done (see _make_durable).
    durable: asyncio.Future[None] | None = None
    # The local policy said `ask`: the rule, and whether the human approved (see _approve).
    approval_rule: str | None = None
    approval_deadline: float | None = None  # server time; set while waiting
    approved: bool = False
    # Brokered credentials of a running exec (files, git helper), closed when it ends.
    delivery: delivery.Prepared | None = None
    # Its output as it leaves the device: redacted (see Daemon._redacted_output).
    redacting: Redacting | None = None
    # The policy's max output size when it started: output past it is not sent.
    max_output: int | None = None

    @property
    def kind(self) -> str | None:
        return self.command.WhichOneof("kind") if self.command is not None else None

    @property
    def has_output(self) -> bool:
        return self.kind in ("exec", "read_file", "list_dir")


def _refused(command_id: str, refusal: Refusal) -> pb.DeviceMessage:
    return pb.DeviceMessage(
        refused=pb.Refused(command_id=command_id, reason=refusal.reason, message=refusal.message)
    )


def _finished(
    command_id: str,
    *,
    exit_code: int,
    error: str = "",
    signal: int = 0,
    total: int,
    seconds: float,
    timed_out: bool = False,
) -> pb.DeviceMessage:
    duration = Duration()
    duration.FromNanoseconds(max(0, int(seconds * 1e9)))
    return pb.DeviceMessage(
        finished=pb.Finished(
            command_id=command_id,
            exit_code=exit_code,
            signal=signal,
            error=error,
            total_output_bytes=total,
            duration=duration,
            timed_out=timed_out,
        )
    )


def _not_after(command: pb.Command) -> float | None:
    if not command.HasField("not_after"):
        return None
    ts = command.not_after
    if ts.seconds == 0 and ts.nanos == 0:
        return None
    return ts.seconds + ts.nanos / 1e9


class Daemon:
    def __init__(
        self,
        config: DeviceConfig,
        *,
        state_directory: Path,
        journal: Journal,
        policy: Policy,
        status: StatusReporter,
        limits: ExecLimits,
        default_cwd: Path | None = None,
        use_zygote: bool | None = None,
        credentials: CredentialStore | None = None,
    ) -> None:
        self.config = config
        self.state_directory = state_directory
        self.journal = journal
        self.policy = policy
        self.status = status
        self.limits = limits
        # None: the policy's default root (its first allowed root), read at each start.
        self.default_cwd = default_cwd
        self.credentials = credentials
        self._redactor = Redactor.empty()
        self._redactor_stamp: tuple[int, int] | None = None
        self._redactor_checked = float("-inf")
        self.approvals = Approvals(state_directory)
        self.audit = AuditLog(state_directory, redact=self.redact_text)
        self.commands: dict[str, Active] = {}
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        # Supervisors that recorded their status but had not exited when we looked; polled
        # until reaped so they never linger as zombies.
        self._exiting: list[subprocess.Popen[bytes]] = []
        # command id -> pidfd of its supervisor, registered with the event loop.
        self._pidfds: dict[str, int] = {}
        self.wake = asyncio.Event()
        self.control: asyncio.Queue[pb.DeviceMessage] | None = None
        self._start_heap: list[tuple[int, str]] = []
        self._start_ready = asyncio.Event()
        self._starting = False  # the starter is inside _start (a file op may take long)
        # server clock minus local clock, from the latest Challenge; None until one arrives.
        self.clock_offset: float | None = None
        self._last_ack_flush = time.monotonic()
        self._last_prune = time.monotonic()
        self._publish_timer: asyncio.TimerHandle | None = None
        self._sync_scheduled = False
        if use_zygote is None:
            use_zygote = os.environ.get("ENDPOINTD_ZYGOTE", "1") != "0"
        # Forks supervisors from an already-running interpreter; None: always start fresh.
        self.zygote: Zygote | None = Zygote() if use_zygote else None

    # ------------------------------------------------------------------ recovery

    def recover(self) -> None:
        """Rebuild the in-memory view from the journal after a (re)start."""
        # A new key for this boot: answers given to a previous daemon are void, and only
        # someone who can read the state dir (the owner, never a sandboxed command) can
        # make new ones.
        self.approvals.renew_key()
        pruned = self.journal.prune()
        if pruned:
            log.info("pruned %d acknowledged command records", pruned)
        for entry in self.journal.active():
            active = self._from_entry(entry)
            self.commands[active.command_id] = active
            if active.state == "accepted":
                self._queue_start(active)
            elif active.state == "running":
                self._reattach(active)
        if self.commands:
            log.info("resuming %d journaled command(s)", len(self.commands))
        self._publish()

    def _from_entry(self, entry: Entry) -> Active:
        command = pb.Command.FromString(entry.body) if entry.body is not None else None
        result = pb.DeviceMessage.FromString(entry.result) if entry.result is not None else None
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
            active.total = result.finished.total_output_bytes if result.HasField("finished") else 0
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

    def handle_server_message(self, message: pb.ServerMessage) -> None:
        kind = message.WhichOneof("msg")
        if kind == "command":
            self.handle_command(message.command)
        elif kind == "ack":
            self.handle_ack(message.ack)
        elif kind == "challenge":
            log.warning("ignoring an unexpected second Challenge on the stream")
        # Heartbeats are handled by the connection (liveness and ack_seq).

    def handle_command(self, command: pb.Command) -> None:
        body = command.SerializeToString(deterministic=True)
        digest = hashlib.sha256(body).digest()
        command_id = command.command_id
        existing = self.journal.get(command_id) if command_id else None
        if existing is not None:
            self._redelivered(command, existing, digest)
            return

        refusal, rule = validate(command), "validation"
        if refusal is None and self._expired(command):
            refusal, rule = (
                Refusal(pb.Refused.REASON_EXPIRED, "not_after passed before the command arrived"),
                "not_after",
            )
        decision: Decision | None = None
        if refusal is None:
            decision = self.policy.check(command)
            if decision.action == "deny":
                refusal, rule = decision.refusal, decision.rule
        if refusal is None and command.credentials:
            try:
                delivery.check(command.credentials)
            except delivery.DeliveryError as exc:
                refusal = Refusal(pb.Refused.REASON_CREDENTIAL_UNAVAILABLE, str(exc))
                rule = "credentials"
        if refusal is not None:
            refusal = Refusal(refusal.reason, self.redact_text(refusal.message))
            log.info("refusing %s: %s", command_id or "(no id)", refusal.message)
            self.audit.record("refused", command_id, rule, refusal.message)
            result = _refused(command_id, refusal)
            if not command_id:
                self._send(result)  # nothing to journal it under
                return
            self.journal.insert(
                command_id=command_id,
                seq=command.seq,
                body=body,
                body_sha256=digest,
                state="finished",
                accepted=False,
                result=result.SerializeToString(),
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
            self._send(pb.DeviceMessage(accepted=pb.Accepted(command_id=command_id)))

    def _redelivered(self, command: pb.Command, existing: Entry, digest: bytes) -> None:
        command_id = command.command_id
        if existing.body_sha256 != digest:
            # Sent once and not journaled: the journal row belongs to the original command.
            log.warning(
                "refusing %s: same id as a journaled command, different content", command_id
            )
            self.audit.record("refused", command_id, "duplicate", "same id as a journaled command")
            self._send(
                _refused(
                    command_id,
                    Refusal(
                        pb.Refused.REASON_DUPLICATE,
                        "command_id is already journaled on this device with different content",
                    ),
                )
            )
            return
        log.info("redelivery of %s (%s): replaying, not re-running", command_id, existing.state)
        if existing.accepted:
            self._send(pb.DeviceMessage(accepted=pb.Accepted(command_id=command_id)))
        active = self.commands.get(command_id)
        if active is not None:
            active.sent = min(active.sent, active.acked)
            active.result_sent = False
            self.wake.set()
        elif existing.result is not None:
            # Acknowledged already; the server evidently lost that, so tell it again.
            self._send(pb.DeviceMessage.FromString(existing.result))

    def handle_ack(self, ack: pb.Ack) -> None:
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

    # ------------------------------------------------------------------ starting

    def _queue_start(self, active: Active) -> None:
        heapq.heappush(self._start_heap, (active.seq, active.command_id))
        self._start_ready.set()

    def set_clock(self, server_time: float) -> None:
        offset = server_time - time.time()
        if abs(offset) > SKEW_WARNING_SECONDS:
            log.warning("this machine's clock is %.0f s off the server's", -offset)
        self.clock_offset = offset
        self._start_ready.set()

    def server_now(self) -> float:
        return time.time() + (self.clock_offset or 0.0)

    def _expired(self, command: pb.Command) -> bool:
        deadline = _not_after(command)
        return deadline is not None and self.server_now() > deadline

    async def starter(self) -> None:
        """Start accepted commands one at a time, lowest seq first."""
        if self.zygote is not None:
            self.zygote.ensure_started()
        while True:
            await self._start_ready.wait()
            self._start_ready.clear()
            # Not before the first Challenge: not_after is judged in server time.
            while self._start_heap and self.clock_offset is not None:
                _, command_id = heapq.heappop(self._start_heap)
                active = self.commands.get(command_id)
                if active is None or active.state != "accepted" or active.command is None:
                    continue
                self._starting = True
                try:
                    await self._start(active)
                except Exception as exc:  # a bug or OS failure must not stall the queue
                    log.exception("starting %s failed", command_id)
                    self._finish_result(
                        active,
                        _finished(
                            command_id,
                            exit_code=-1,
                            error=f"endpointd could not start the command: {exc}",
                            total=0,
                            seconds=0,
                        ),
                        total=0,
                    )
                finally:
                    self._starting = False

    async def _make_durable(self, active: Active) -> None:
        """Wait for the journal row's fsync if it is still running, then send Accepted."""
        durable, active.durable = active.durable, None
        if durable is not None:
            await durable
            self._send(pb.DeviceMessage(accepted=pb.Accepted(command_id=active.command_id)))

    async def _start(self, active: Active) -> None:
        command = active.command
        assert command is not None
        if active.kind != "exec" or self._expired(command):
            await self._make_durable(active)
        if self._expired(command):
            self._finish_result(
                active,
                _refused(
                    active.command_id,
                    Refusal(
                        pb.Refused.REASON_EXPIRED, "not_after passed before the command could start"
                    ),
                ),
                total=0,
            )
            return
        if not active.journaled_running and not await self._allowed_now(active, command):
            return
        if not active.journaled_running:
            self.journal.mark_running(active.command_id)
        active.max_output = self.policy.limits.max_output_bytes
        if command.HasField("read_file"):
            cap = active.max_output
            if not command.read_file.HasField("limit") or command.read_file.limit > cap:
                command.read_file.limit = cap
        active.state = "running"
        active.started_mono = time.monotonic()
        self._publish()
        kind = active.kind
        if kind == "exec":
            await self._start_exec(active, command.exec)
        elif kind == "cancel":
            result = self._cancel(command.cancel)
            self._finish_op(active, result, total=0)
        else:
            await self._run_file_op(active, command)

    async def _allowed_now(self, active: Active, command: pb.Command) -> bool:
        """The policy again, at start: it may have changed since the command arrived (or the
        daemon restarted). An `ask` starts the wait for a human and returns False; the
        command is started later, once approved (:meth:`_await_approval`)."""
        decision = self.policy.check(command)
        if decision.action == "deny":
            assert decision.refusal is not None
            self._refuse_started(active, decision.refusal, decision.rule)
            return False
        if decision.action == "ask" and not active.approved:
            if active.approval_rule is None:
                active.approval_rule = decision.rule
                asyncio.get_running_loop().create_task(
                    self._await_approval(active, command, decision),
                    name=f"approval:{active.command_id}",
                )
            return False
        return True

    async def _await_approval(
        self, active: Active, command: pb.Command, decision: Decision
    ) -> None:
        limit = self.policy.limits.ask_timeout_seconds
        # All the owner is shown passes the redactor: exec.env is non-secret by the
        # protocol, yet a value (or stdin, or a file's content) may still hold a credential.
        queued = self.approvals.request(
            active.command_id,
            self.redact_text(summarize(command)),
            self.redact_text(command.origin),
            decision.rule,
            limit,
            details=describe(command, self.redact_text),
        )
        # Queued before a restart: the request keeps its deadline (never more than a timeout).
        timeout = min(float(limit), max(0.0, queued.expires_at - time.time()))
        deadline = self.server_now() + timeout
        self._send_awaiting(active, deadline)
        active.approval_deadline = deadline
        log.info("%s waits for local approval (%s)", active.command_id, decision.rule)

        def forged(detail: str) -> None:
            # An answer not made by `endpointd approve`/`deny` under this daemon's key.
            try:
                self.audit.record("forged_approval", active.command_id, decision.rule, detail)
            except OSError as exc:
                log.warning("cannot write the audit log: %s", exc)

        outcome = await self.approvals.wait(active.command_id, timeout, on_forged=forged)
        self.approvals.forget(active.command_id)
        active.approval_deadline = None
        if active.state != "accepted" or self.commands.get(active.command_id) is not active:
            return  # cancelled meanwhile
        if outcome == "approved":
            self.audit.record("approved", active.command_id, decision.rule, "approved locally")
            active.approved = True
            self._send(pb.DeviceMessage(accepted=pb.Accepted(command_id=active.command_id)))
            self._queue_start(active)
            return
        event = "denied" if outcome == "denied" else "approval_timeout"
        refusal = decision.approval_refusal("denied" if outcome == "denied" else "timeout")
        self.audit.record(event, active.command_id, decision.rule, refusal.message)
        self._finish_result(active, _refused(active.command_id, refusal), total=0)

    def _send_awaiting(self, active: Active, deadline: float) -> None:
        when = Timestamp()
        when.FromNanoseconds(int(deadline * 1e9))
        self._send(
            pb.DeviceMessage(
                awaiting_approval=pb.AwaitingApproval(
                    command_id=active.command_id, rule=active.approval_rule or "", deadline=when
                )
            )
        )

    def _refuse_started(self, active: Active, refusal: Refusal, rule: str) -> None:
        refusal = Refusal(refusal.reason, self.redact_text(refusal.message))
        log.info("refusing %s: %s", active.command_id, refusal.message)
        self.audit.record("refused", active.command_id, rule, refusal.message)
        self._finish_result(active, _refused(active.command_id, refusal), total=0)

    async def _start_exec(self, active: Active, ex: pb.ExecCommand) -> None:
        active.launching = True
        try:
            await self._launch_exec(active, ex)
        finally:
            active.launching = False

    async def _deliver(self, active: Active) -> bool:
        """Resolve and prepare the command's brokered credentials, and its proxy (http
        delivery, or ``network = "proxy"``); False if refused."""
        command = active.command
        assert command is not None
        rules = self.policy.rules
        network = rules.network if rules is not None else "allow"
        if not command.credentials and network != "proxy":
            return True
        prepared: delivery.Prepared | None = None
        values: dict[str, bytes] = {}
        store = self.credentials
        try:
            if command.credentials and store is None:
                raise delivery.DeliveryError("this endpointd has no credential store")
            if store is not None and command.credentials:
                indexed = set(await asyncio.to_thread(store.names))
                for ref in command.credentials:
                    # Only what the store indexes: the redactor masks exactly those values,
                    # so a keyring entry set behind its back is never delivered unmasked.
                    if ref.name not in indexed:
                        raise delivery.DeliveryError(
                            f"credential {ref.name!r} is not stored on this device "
                            f"(`endpointd creds add {ref.name}`)"
                        )
                    value = await asyncio.to_thread(store.get, ref.name)
                    if value is None:
                        raise delivery.DeliveryError(
                            f"credential {ref.name!r} is not stored on this device "
                            f"(`endpointd creds add {ref.name}`)"
                        )
                    values[ref.name] = value
            ca = None
            if any(ref.delivery == pb.CredentialRef.DELIVERY_HTTP for ref in command.credentials):
                ca = await asyncio.to_thread(device_ca, self.policy.config_dir)
            # The CA bundle goes in the command's private TMPDIR, which it may read.
            tmp = private_tmpdir(active.spool)
            prepared = delivery.prepare(
                active.spool,
                command.credentials,
                values,
                scopes=rules.credentials if rules is not None else {},
                egress=Egress(
                    network=network,
                    allow_hosts=rules.proxy_hosts if rules is not None else (),
                ),
                directory=tmp,
                ca=ca,
                root_pid=lambda: active.pid,
            )
            await prepared.start()
        except (delivery.DeliveryError, CredentialError, OSError) as exc:
            if prepared is not None:
                prepared.close()
            await self._make_durable(active)
            message = str(exc)
            if isinstance(exc, OSError) and not isinstance(exc, delivery.DeliveryError):
                message = f"cannot prepare the command's credentials: {exc.strerror or exc}"
            self._refuse_started(
                active,
                Refusal(pb.Refused.REASON_CREDENTIAL_UNAVAILABLE, message),
                "credentials",
            )
            return False
        active.delivery = prepared
        if not values:
            return True
        # The values delivered must be in the redactor this command's output will pass:
        # rebuild it now if the store changed since it was last looked at.
        self._redactor_checked = float("-inf")
        if not self.redactor().covers(values.values()):
            prepared.close()
            self._refuse_started(
                active,
                Refusal(
                    pb.Refused.REASON_CREDENTIAL_UNAVAILABLE,
                    "a credential changed while the command started; send it again",
                ),
                "credentials",
            )
            active.delivery = None
            return False
        assert store is not None
        for name in prepared.names:
            with contextlib.suppress(CredentialError, OSError):
                store.touch(name)
        return True

    def _exec_limits(self) -> ExecLimits:
        """The daemon's limits, capped by the local policy's (which follow edits)."""
        cap = self.policy.limits.max_runtime_seconds
        return ExecLimits(
            max_timeout_seconds=min(self.limits.max_timeout_seconds, cap),
            kill_grace_seconds=self.limits.kill_grace_seconds,
        )

    def _confinement(self, active: Active, ex: pb.ExecCommand) -> Confinement | None:
        """The sandbox of this command (None: refused, and already finished as such)."""
        rules = self.policy.rules
        cwd = ex.cwd or str(self.default_cwd or self.policy.default_root)
        workspace = self.policy.workspace_for(cwd)
        if rules is None or workspace is None:
            self._refuse_started(
                active,
                Refusal(pb.Refused.REASON_POLICY_DENIED, f"{cwd} is not inside an allowed root"),
                "allowed_roots",
            )
            return None
        proxy = active.delivery.proxy_port if active.delivery is not None else None
        try:
            return sandbox.plan(
                rules,
                denied=[str(d.path) for d in self.policy.denied_paths],
                workspace=str(workspace),
                tmpdir=str(private_tmpdir(active.spool)),
                proxy_port=proxy,
            )
        except sandbox.SandboxUnavailable as exc:
            self._refuse_started(
                active, Refusal(pb.Refused.REASON_POLICY_DENIED, str(exc)), "sandbox"
            )
            return None

    async def _launch_exec(self, active: Active, ex: pb.ExecCommand) -> None:
        if not await self._deliver(active):
            return
        confinement = self._confinement(active, ex)
        if confinement is None:
            await self._make_durable(active)
            return
        rules = self.policy.rules
        spec = exec_spec(
            active.spool,
            ex,
            limits=self._exec_limits(),
            default_cwd=self.default_cwd or self.policy.default_root,
            delivery=active.delivery,
            confinement=confinement,
            passed_env=rules.env.passed if rules is not None else (),
        )
        pid: int | None = None
        how = "fresh interpreter"
        zygote = self.zygote
        if zygote is not None and zygote.ready():
            try:
                # Gated while the journal's fsync runs: the spare gets ready meanwhile.
                gated = active.durable is not None
                pid, active.done = await zygote.launch(active.spool, spec, gated=gated)
                how = "zygote"
            except ZygoteError as exc:
                log.warning("%s; starting %s without it", exc, active.command_id)
                # The request may have reached it: make sure a late fork cannot run the
                # command too, or adopt the fork that already did.
                pid = revoke_or_adopt(active.spool)
                how = "zygote (adopted)"
            else:
                if gated:
                    try:
                        await self._make_durable(active)
                    except BaseException:
                        active.done.close()  # withdrawn: the spare exits without running it
                        active.done = None
                        raise
                    go(active.done)
        await self._make_durable(active)  # (a no-op if done above)
        if pid is None:
            proc = start_supervisor(active.spool, spec)
            self.children[active.command_id] = proc
            pid = proc.pid
            how = "fresh interpreter"
            if zygote is not None:
                zygote.ensure_started()  # ready in the background, for the next command
        active.pid = pid
        self._watch_exit(active)
        self.journal.set_pid(active.command_id, pid)
        log.info(
            "started %s: %s (supervisor pid %d, %s)", active.command_id, list(ex.argv), pid, how
        )

    async def _run_file_op(self, active: Active, command: pb.Command) -> None:
        """Run a read_file, write_file or list_dir confined to the allowed root holding its
        path (:mod:`endpointd.commands.fileops`): no denied directory is walked through, and what
        the open really reached is judged again before a byte moves (``judge``)."""
        from endpointd.guard.files import root_of
        from endpointd.guard.policy import FileOp

        active.spool.mkdir(parents=True, exist_ok=True, mode=0o700)
        writer = SpoolWriter(active.spool)
        active.local_task = True
        policy = self.policy
        kind = active.kind or ""
        path = str(getattr(command, kind).path)
        op: FileOp = "read" if kind == "read_file" else "list" if kind == "list_dir" else "write"

        def verdict(decision: Decision) -> str | None:
            if decision.action == "allow":
                return None
            if (
                decision.action == "ask"
                and active.approved
                and decision.rule == active.approval_rule
            ):
                return None  # the owner approved this rule for this command
            return decision.rule

        def judge(real: str) -> str | None:
            """The rule refusing what the operation really reached, or None: the decision
            at the start, again, on the real path."""
            return verdict(policy.check_path(real, op))

        def entry_judge(real: str) -> str | None:
            """A listing's entries and subdirectories: as :func:`judge`, except that
            default_action, which judged the listing as a whole, does not hide them."""
            decision = policy.check_path(real, "list")
            return None if decision.rule == "default_action" else verdict(decision)

        root = root_of(path, [str(r) for r in policy.allowed_roots])
        try:
            if root is None:
                result = OpResult(1, f"{kind} path {path} is outside the allowed roots")
            elif kind == "read_file":
                result = await asyncio.to_thread(
                    read_file,
                    command.read_file,
                    writer,
                    root=root,
                    denied=policy.denied_rule,
                    judge=judge,
                )
            elif kind == "list_dir":
                result = await asyncio.to_thread(
                    list_dir,
                    command.list_dir,
                    writer,
                    root=root,
                    denied=policy.denied_rule,
                    judge=judge,
                    entries=entry_judge,
                )
            else:
                result = await asyncio.to_thread(
                    write_file,
                    command.write_file,
                    root=root,
                    denied=policy.denied_rule,
                    judge=judge,
                )
        finally:
            writer.close()
            active.local_task = False
        self._finish_op(active, result, total=writer.total)

    def _cancel(self, cancel: pb.CancelCommand) -> OpResult:
        target_id = cancel.target_command_id
        target = self.commands.get(target_id)
        if target is None:
            known = self.journal.get(target_id)
            if known is None:
                return OpResult(1, f"unknown command {target_id}")
            return OpResult(1, f"command {target_id} is not running (already finished)")
        if target.approval_deadline is not None:
            # Still waiting for a local human: the wait ends, and the command never runs.
            self.approvals.forget(target_id)
            target.approval_deadline = None
            self._finish_result(
                target,
                _refused(
                    target_id,
                    Refusal(
                        pb.Refused.REASON_APPROVAL_DENIED,
                        "cancelled by the control plane while waiting for local approval",
                    ),
                ),
                total=0,
            )
            return OpResult()
        if target.state != "running" or target.kind != "exec" or target.pid is None:
            return OpResult(1, f"command {target_id} is not a running exec ({target.state})")
        if not request_cancel(target.spool, target.pid, cancel.grace_seconds):
            return OpResult(1, f"command {target_id} is no longer running")
        log.info("cancelling %s (grace %ss)", target_id, cancel.grace_seconds or "default")
        return OpResult()

    # ------------------------------------------------------------------ finishing

    def _finish_result(self, active: Active, result: pb.DeviceMessage, *, total: int) -> None:
        if active.delivery is not None:
            active.delivery.close()
            active.delivery = None
        if active.kind == "exec":
            # The supervisor removes the files it was given; this catches one that was killed
            # (or a daemon restarted meanwhile, which has no Prepared to close).
            delivery.remove(active.spool)
        if result.HasField("finished") and result.finished.error:
            result.finished.error = self.redact_text(result.finished.error)
        elif result.HasField("refused"):
            result.refused.message = self.redact_text(result.refused.message)
        # Committed at once, made durable just after the writer has been woken to send it.
        self.journal.finish(active.command_id, result.SerializeToString(), durable=False)
        active.state = "finished"
        active.result = result
        active.result_sent = False
        active.total = total
        self.wake.set()
        self._sync_journal_soon()  # after wake.set(): queued behind the writer's wake-up
        self._publish()
        which = result.WhichOneof("msg")
        if which == "finished":
            f = result.finished
            log.info(
                "finished %s: exit %d signal %d%s%s",
                active.command_id,
                f.exit_code,
                f.signal,
                " (timed out)" if f.timed_out else "",
                f" error: {f.error}" if f.error else "",
            )

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
            _finished(
                active.command_id,
                exit_code=result.exit_code,
                error=result.error,
                total=total,
                seconds=self._elapsed(active),
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
        result = _finished(
            active.command_id,
            exit_code=status.exit_code,
            error=error,
            signal=status.signal,
            total=total,
            seconds=seconds,
            timed_out=status.timed_out,
        )
        result.finished.output_truncated = truncated
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
        result = _finished(
            active.command_id, exit_code=-1, error=UNKNOWN_OUTCOME, total=total, seconds=0
        )
        result.finished.output_truncated = truncated
        self._finish_result(active, result, total=total)

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

    def check_running(self) -> None:
        self._exiting = [p for p in self._exiting if p.poll() is None]
        for active in list(self.commands.values()):
            self._check_exec(active)

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

    # ------------------------------------------------------------------ sending

    def _send(self, message: pb.DeviceMessage) -> None:
        if self.control is None:
            log.debug("not connected; dropping %s", message.WhichOneof("msg"))
            return
        self.control.put_nowait(message)
        self.wake.set()

    def _reader(self, active: Active) -> SpoolReader:
        if active.reader is None:
            active.reader = SpoolReader(active.spool)
        return active.reader

    def in_flight(self) -> list[pb.InFlight]:
        return [
            pb.InFlight(
                command_id=a.command_id,
                acked_output_offset=a.acked,
                state=pb.InFlight.STATE_AWAITING_APPROVAL
                if a.approval_deadline is not None
                else _STATE_TO_WIRE[a.state],
            )
            for a in sorted(self.commands.values(), key=lambda a: a.seq)
        ]

    def on_connected(self, control: asyncio.Queue[pb.DeviceMessage]) -> None:
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

    def next_output_message(self) -> pb.DeviceMessage | None:
        """The next OutputChunk or result to send on the current stream, if any."""
        for active in sorted(self.commands.values(), key=lambda a: a.seq):
            end = active.total if active.total is not None else active.max_output
            if active.has_output and (end is None or active.sent < end):
                got = self._redacted_output(active)
                if got is not None:
                    stream, data = got
                    if end is not None:
                        data = data[: end - active.sent]
                    chunk = pb.OutputChunk(
                        command_id=active.command_id,
                        stream=stream,  # type: ignore[arg-type]
                        offset=active.sent,
                        data=data,
                    )
                    active.sent += len(data)
                    return pb.DeviceMessage(output=chunk)
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
                return active.result
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

    # ------------------------------------------------------------------ redaction

    def redactor(self) -> Redactor:
        """The redactor for every registered credential and the daemon's own secrets (the
        device key, secret-looking variables of its environment), rebuilt when they change."""
        now = time.monotonic()
        if now - self._redactor_checked < REDACTOR_RECHECK:
            return self._redactor
        self._redactor_checked = now
        own = own_secrets(self.config.key)
        if self.credentials is None:
            if not self._redactor.covers(own.values()):
                self._redactor = Redactor(own)
            return self._redactor
        try:
            info = self.credentials.path.stat()
            stamp: tuple[int, int] | None = (info.st_mtime_ns, info.st_size)
        except FileNotFoundError:
            stamp = None
        if stamp != self._redactor_stamp or not self._redactor.covers(own.values()):
            try:
                values = self.credentials.values()
            except (CredentialError, OSError) as exc:
                # Keep masking what we knew rather than nothing.
                log.error("cannot read the stored credentials for redaction: %s", exc)
                return self._redactor
            # Credential names never hold ':', so the labels of `own` cannot collide.
            self._redactor = Redactor({**own, **values})
            self._redactor_stamp = stamp
        return self._redactor

    def redact_text(self, text: str) -> str:
        return self.redactor().text(text) if text else text

    # ------------------------------------------------------------------ status

    def _publish(self) -> None:
        """Refresh status.json soon: at most every PUBLISH_DELAY, never on a command's path."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._publish_now()
            return
        if self._publish_timer is None:
            self._publish_timer = loop.call_later(PUBLISH_DELAY, self._publish_now)

    def _publish_now(self) -> None:
        self._publish_timer = None
        running = [
            {"command_id": a.command_id, "kind": a.kind, "state": a.state}
            for a in sorted(self.commands.values(), key=lambda a: a.seq)
        ]
        with contextlib.suppress(OSError):
            self.status.update(commands=running)

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
