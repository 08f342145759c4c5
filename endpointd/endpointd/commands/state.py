"""What the daemon's parts share: the commands in flight and the state around them.

:class:`Active` is one journaled command the server has not fully acknowledged, with all the
daemon knows about it. :class:`Core` holds the daemon's state (journal, policy, commands by
id, zygote, the queue to the connection) and the two services every part uses: the
redactor, through which every text and byte leaving the device passes, and status.json.
The parts are layers on it (:mod:`endpointd.commands.daemon` draws them); this module calls
none of them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from endpointd import wire
from endpointd.audit import AuditLog
from endpointd.config import DeviceConfig
from endpointd.guard.approvals import Approvals
from endpointd.guard.policy import Policy
from endpointd.harness.logins import login_secrets
from endpointd.journal import Journal, State
from endpointd.paths import data_dir
from endpointd.process.executor import ExecLimits, Zygote
from endpointd.rules.decisions import Refusal
from endpointd.secrets import delivery, own_secrets
from endpointd.secrets.redact import Redactor, StreamRedactor
from endpointd.secrets.store import CredentialError, CredentialStore
from endpointd.spool import SpoolReader
from endpointd.status import StatusReporter
from endpointd.workspaces.manager import Workspaces
from superagent_shared.messages import Command, Finished, Refused, Result
from superagent_shared.protocol import MAX_OUTPUT_CHUNK_BYTES

log = logging.getLogger(__name__)

# status.json (for `endpointd status`) trails the daemon's state by at most this much.
PUBLISH_DELAY = 0.1
# How often the credential store is checked for changes (a new credential is masked from then).
REDACTOR_RECHECK = 0.05


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
    command: Command | None
    state: State
    spool: Path
    acked: int = 0
    # Next offset to send on the current stream; rewound to `acked` on every (re)connect.
    sent: int = 0
    result: Result | None = None
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
    # The local policy said `ask`: the rule, and whether the human approved (see
    # Starter._await_approval).
    approval_rule: str | None = None
    approval_deadline: float | None = None  # server time; set while waiting
    approved: bool = False
    # Brokered credentials of a running exec (files, git helper), closed when it ends.
    delivery: delivery.Prepared | None = None
    # Its output as it leaves the device: redacted (see Sender._redacted_output).
    redacting: Redacting | None = None
    # The policy's max output size when it started: output past it is not sent.
    max_output: int | None = None

    @property
    def kind(self) -> str | None:
        return self.command.kind if self.command is not None else None

    @property
    def has_output(self) -> bool:
        return self.kind in ("exec", "read_file", "list_dir", "search", "glob", "prepare_workspace")


# A result's text (Refused.message, Finished.error) is cut here: a message quoting what
# the server sent (a path of megabytes) must never make a result the gateway cannot take
# (it ends a stream for a message over its size limit, and the result would be resent on
# every new one).
MAX_RESULT_TEXT = 16 * 1024


def result_text(text: str) -> str:
    """``text``, cut to :data:`MAX_RESULT_TEXT` characters, saying how long it was."""
    if len(text) <= MAX_RESULT_TEXT:
        return text
    return f"{text[:MAX_RESULT_TEXT]}… (cut; {len(text)} characters in all)"


def refused(command_id: str, refusal: Refusal) -> Refused:
    return Refused(
        command_id=command_id, reason=refusal.reason, message=result_text(refusal.message)
    )


def finished(
    command_id: str,
    *,
    exit_code: int,
    error: str = "",
    signal: int = 0,
    total: int,
    seconds: float,
    timed_out: bool = False,
    truncated: bool = False,
) -> Finished:
    return Finished(
        command_id=command_id,
        exit_code=exit_code,
        signal=signal,
        error=result_text(error),
        total_output_bytes=total,
        duration_ns=max(0, int(seconds * 1e9)),
        timed_out=timed_out,
        output_truncated=truncated,
    )


class Core:
    """The daemon's state, its redactor and its status file (see the module doc)."""

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
        data_directory: Path | None = None,
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
        # The tickets' workspaces (PrepareWorkspace, ReleaseWorkspace) and the clones found
        # under the allowed roots (the RepositoryReport); their operations run as tasks.
        self.workspaces = Workspaces(
            state_directory, data_directory if data_directory is not None else data_dir().path
        )
        self._workspace_tasks: set[asyncio.Task[None]] = set()
        self.audit = AuditLog(state_directory, redact=self.redact_text)
        self.commands: dict[str, Active] = {}
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        # Supervisors that recorded their status but had not exited when we looked; polled
        # until reaped so they never linger as zombies.
        self._exiting: list[subprocess.Popen[bytes]] = []
        # command id -> pidfd of its supervisor, registered with the event loop.
        self._pidfds: dict[str, int] = {}
        self.wake = asyncio.Event()
        self.control: asyncio.Queue[wire.Outgoing] | None = None
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

    # ------------------------------------------------------------------ redaction

    def redactor(self) -> Redactor:
        """The redactor for every registered credential and the daemon's own secrets (the
        device key, secret-looking variables of its environment), rebuilt when they change."""
        now = time.monotonic()
        if now - self._redactor_checked < REDACTOR_RECHECK:
            return self._redactor
        self._redactor_checked = now
        # (The owner's harness logins too: a harness run may read its own.)
        own = {**own_secrets(self.config.key), **login_secrets(self.policy.home)}
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
