"""Starting: accepted commands, one at a time in seq order, from the policy to a process.

At its start a command meets the policy again (it may have changed since it arrived); an
``ask`` waits for the owner (:meth:`Starter._await_approval`). An exec then gets its
credentials (:meth:`Starter._deliver`) and its sandbox (:meth:`Starter._confinement`), and
is handed to a supervisor: a zygote's spare, or a fresh interpreter. File operations run in
a worker thread, confined to the allowed root holding their path; a cancel acts on its
target. A workspace's preparation or release (:mod:`endpointd.workspaces.operations`) runs
as a task of its own, so a long fetch or setup step does not hold up the commands behind
it. Nothing starts before the journal row recording that it did is durable.

A RunHarness never runs as such: :meth:`Starter._build_harness` turns it into the exec
the device's harness table and local policy make of it (:mod:`endpointd.harness.runs`),
on receipt and again at its start (the policy may have changed), and from there it takes
the exec's path: the policy judges its real argv, it gets its harness's credential, its
session store (:meth:`Starter._harness_store`: its own, never the owner's), its sandbox
(plus that store and its harness's login, read-only), its supervisor.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import os
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

from endpointd import wire
from endpointd.commands import search
from endpointd.commands.exits import Exits
from endpointd.commands.fileops import OpResult, list_dir, read_file, write_file
from endpointd.commands.state import Active, finished, refused
from endpointd.guard import sandbox, view
from endpointd.guard.approvals import describe, summarize
from endpointd.guard.confinement import Confinement
from endpointd.harness import runs, stores
from endpointd.process.executor import (
    ExecLimits,
    ZygoteError,
    exec_spec,
    go,
    private_tmpdir,
    request_cancel,
    revoke_or_adopt,
    start_supervisor,
)
from endpointd.rules.decisions import Decision, Refusal
from endpointd.rules.remotes import https_authority
from endpointd.secrets import delivery
from endpointd.secrets.ca import device_ca
from endpointd.secrets.proxy import Egress, host_matches
from endpointd.secrets.store import CredentialError
from endpointd.spool import STREAM_DATA, SpoolWriter
from endpointd.workspaces import operations, setup, tickets
from endpointd.workspaces.bases import FetchAuth
from endpointd.workspaces.errors import WorkspaceError
from endpointd.workspaces.manager import SetupPlan
from endpointd.workspaces.store import Setup
from superagent_shared.messages import (
    Cancel,
    Command,
    CredentialRef,
    Delivery,
    Exec,
    Glob,
    HarnessExec,
    ListDir,
    PrepareWorkspace,
    ReadFile,
    Reason,
    ReleaseWorkspace,
    RunHarness,
    Search,
    WriteFile,
)

log = logging.getLogger(__name__)

# Clock offsets beyond this are worth a warning: not_after decisions are made in server time.
SKEW_WARNING_SECONDS = 30.0


class Starter(Exits):
    """Starting, on finishing."""

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

    def _expired(self, command: Command) -> bool:
        deadline = command.not_after
        return deadline is not None and self.server_now() > deadline

    def _bind(self, command: Command) -> Command:
        """``command`` as it runs for its ticket: an exec's empty cwd is the ticket's
        workspace (:mod:`endpointd.workspaces.tickets`)."""
        return tickets.bind(self.workspaces.store, command)

    def _outside_ticket(self, command: Command) -> Decision | None:
        """The refusal of a command that reaches past its ticket's workspace, else None."""
        return tickets.refusal(self.workspaces.store, command, str(self.policy.workspaces_root))

    def _build_harness(self, command: Command) -> Command | Refusal:
        """``command`` with its RunHarness (or the HarnessExec built from it earlier) built
        now by the harness table under the current policy, its credential the one the
        policy names for the harness; the refusal when it may not or cannot run. Any other
        command comes back as it is."""
        op = command.op
        if isinstance(op, RunHarness):
            if command.credentials:
                return Refusal(
                    Reason.POLICY_DENIED,
                    "run_harness takes no credentials from the control plane: the device"
                    " delivers the harness's own ([harness.NAME] credential in policy.toml)",
                )
            request = op
        elif isinstance(op, HarnessExec) and op.request is not None:
            request = op.request
        else:
            return command
        try:
            built = runs.build(request, self.policy)
        except runs.HarnessRefused as exc:
            return Refusal(exc.reason, exc.message)
        ref = runs.credential_ref(request.harness, self.policy)
        return replace(command, op=built, credentials=(ref,) if ref is not None else ())

    async def starter(self) -> None:
        """Start accepted commands one at a time, lowest seq first."""
        if self.zygote is not None:
            self.zygote.ensure_started()
        upkeep = asyncio.get_running_loop().create_task(
            operations.upkeep_forever(self.workspaces, self.policy), name="endpointd-workspaces"
        )
        try:
            await self._start_in_order()
        finally:
            upkeep.cancel()

    async def _start_in_order(self) -> None:
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
                        finished(
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
            self._send(wire.accepted(active.command_id))

    async def _start(self, active: Active) -> None:
        command = active.command
        assert command is not None
        if active.kind != "exec" or self._expired(command):
            await self._make_durable(active)
        if self._expired(command):
            self._finish_result(
                active,
                refused(
                    active.command_id,
                    Refusal(Reason.EXPIRED, "not_after passed before the command could start"),
                ),
                total=0,
            )
            return
        if isinstance(command.op, HarnessExec):
            # Built again from the request: the policy (or the installed CLI) may have
            # changed since it arrived.
            built = self._build_harness(command)
            if isinstance(built, Refusal):
                await self._make_durable(active)
                self._refuse_started(active, built, "harness")
                return
            command = active.command = built
        command = active.command = self._bind(command)
        if not active.journaled_running and not await self._allowed_now(active, command):
            return
        if not active.journaled_running:
            self.journal.mark_running(active.command_id)
        active.max_output = self.policy.limits.max_output_bytes
        op = command.op
        if isinstance(op, ReadFile):
            cap = active.max_output
            if op.limit is None or op.limit > cap:
                op = replace(op, limit=cap)
                command = active.command = replace(command, op=op)
        active.state = "running"
        active.started_mono = time.monotonic()
        self._publish()
        if isinstance(op, Exec):
            await self._start_exec(active, op)
        elif isinstance(op, Cancel):
            result = self._cancel(op)
            self._finish_op(active, result, total=0)
        elif isinstance(op, PrepareWorkspace | ReleaseWorkspace):
            task = asyncio.get_running_loop().create_task(
                self._workspace_op(active, op), name=f"workspace:{active.command_id}"
            )
            self._workspace_tasks.add(task)
            task.add_done_callback(self._workspace_tasks.discard)
        else:
            await self._run_file_op(active, command)

    async def _allowed_now(self, active: Active, command: Command) -> bool:
        """The policy again, at start: it may have changed since the command arrived (or the
        daemon restarted). An `ask` starts the wait for a human and returns False; the
        command is started later, once approved (:meth:`_await_approval`)."""
        decision = self._outside_ticket(command) or self.policy.check(command)
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

    async def _await_approval(self, active: Active, command: Command, decision: Decision) -> None:
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
            self._send(wire.accepted(active.command_id))
            self._queue_start(active)
            return
        event = "denied" if outcome == "denied" else "approval_timeout"
        refusal = decision.approval_refusal("denied" if outcome == "denied" else "timeout")
        self.audit.record(event, active.command_id, decision.rule, refusal.message)
        self._finish_result(active, refused(active.command_id, refusal), total=0)

    def _refuse_started(self, active: Active, refusal: Refusal, rule: str) -> None:
        refusal = Refusal(refusal.reason, self.redact_text(refusal.message))
        log.info("refusing %s: %s", active.command_id, refusal.message)
        self.audit.record("refused", active.command_id, rule, refusal.message)
        self._finish_result(active, refused(active.command_id, refusal), total=0)

    async def _start_exec(self, active: Active, ex: Exec) -> None:
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
            if any(ref.delivery == Delivery.HTTP for ref in command.credentials):
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
                Refusal(Reason.CREDENTIAL_UNAVAILABLE, message),
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
                    Reason.CREDENTIAL_UNAVAILABLE,
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

    def _confinement(
        self, active: Active, ex: Exec, store: stores.RunStore | None = None
    ) -> Confinement | None:
        """The sandbox of this command (None: refused, and already finished as such); for a
        harness run, plus its session store and its login files, read-only."""
        cwd = ex.cwd or str(self.default_cwd or self.policy.default_root)
        proxy = active.delivery.proxy_port if active.delivery is not None else None
        # A ticket's command writes in its ticket's workspace, not the root holding it.
        bound = (
            tickets.bound_workspace(self.workspaces.store, active.command)
            if active.command is not None
            else None
        )
        # In its view besides: the git credential helper's socket; a harness's program.
        read: tuple[str, ...] = ()
        git = active.delivery.git if active.delivery is not None else None
        if git is not None:
            read += (os.path.dirname(git.socket_path),)
        if isinstance(ex, HarnessExec) and ex.argv:
            read += view.harness_program(ex.argv[0])
        planned = self._plan_sandbox(
            cwd,
            private_tmpdir(active.spool),
            proxy,
            own=(str(store.path),) if store is not None else (),
            reads=store.logins if store is not None else (),
            extra_read=read,
            workspace=bound,
            ticket=active.command.ticket_id if active.command is not None else "",
        )
        if isinstance(planned, tuple):
            self._refuse_started(active, *planned)
            return None
        return planned

    def _harness_store(self, active: Active, ex: HarnessExec) -> stores.RunStore | None:
        """A harness run's own session store (:mod:`endpointd.harness.stores`), after
        removing the ones no longer kept; None: refused (a resume of a session this project
        did not keep), and already finished as such."""
        request = ex.request
        assert request is not None  # (at its start a run is always built from its request)
        rules = self.policy.rules
        keep = rules.harness.keep_sessions_hours if rules is not None else 0
        try:
            stores.sweep(
                self.state_directory,
                keep_hours=keep,
                max_run_seconds=self._exec_limits().max_timeout_seconds,
            )
            return stores.open_for_run(
                self.state_directory,
                harness=request.harness,
                home=self.policy.home,
                cwd=ex.cwd,
                command_id=active.command_id,
                resume_session=request.resume_session,
            )
        except stores.StoreRefused as exc:
            self._refuse_started(active, Refusal(exc.reason, exc.message), "harness")
        except OSError as exc:
            message = f"cannot make the harness run's session store: {exc}"
            self._refuse_started(active, Refusal(Reason.INVALID, message), "harness")
        return None

    def _plan_sandbox(
        self,
        cwd: str,
        tmpdir: Path,
        proxy: int | None,
        *,
        own: tuple[str, ...] = (),
        reads: tuple[str, ...] = (),
        extra_read: tuple[str, ...] = (),
        workspace: str | None = None,
        ticket: str = "",
    ) -> Confinement | tuple[Refusal, str]:
        """The sandbox of a command working in ``cwd``, or why it cannot have one (the
        refusal and the rule). In a ticket workspace it may also write what a commit
        writes in the clone's git directory (:mod:`endpointd.workspaces.grants`); ``own``:
        directories endpointd made for it in its state dir (a harness run's session store),
        ``reads``: files it may read though denied (that run's login), ``extra_read``: what
        its view holds besides, read-only (the git helper's socket, a harness's program; in a
        ticket workspace, the clone's git directory too). ``workspace``: where
        it may write, when its ticket says so (else the ticket workspace or allowed root
        holding ``cwd``). A ``ticket``'s command cannot read the other tickets' workspaces:
        the directory holding them all is denied to it, less its own (writable) one."""
        rules = self.policy.rules
        where = Path(workspace) if workspace is not None else self.policy.workspace_for(cwd)
        if rules is None or where is None:
            refusal = Refusal(Reason.POLICY_DENIED, f"{cwd} is not inside an allowed root")
            return refusal, "allowed_roots"
        dirs, files = self.workspaces.write_grants(where)
        extra_read += self.workspaces.read_grants(where)
        try:
            return self.policy.confinement(
                workspace=str(where),
                tmpdir=str(tmpdir),
                proxy_port=proxy,
                ticket=bool(ticket),
                extra_write=dirs,
                extra_write_files=files,
                own_write=own,
                read_files=reads,
                extra_read=extra_read,
            )
        except sandbox.SandboxUnavailable as exc:
            return Refusal(Reason.POLICY_DENIED, str(exc)), "sandbox"

    async def _launch_exec(self, active: Active, ex: Exec) -> None:
        if not await self._deliver(active):
            return
        store = None
        if isinstance(ex, HarnessExec):
            store = self._harness_store(active, ex)
            if store is None:
                await self._make_durable(active)
                return
            ex = replace(ex, env={**ex.env, **store.env})
        confinement = self._confinement(active, ex, store)
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
        if zygote is not None:
            # Spares make a PID namespace ahead while commands get one (the policy may
            # change sandbox to "off" and back at any time).
            landlock = spec.get("landlock")
            zygote.prepare_namespaces = bool(landlock and landlock.get("private_proc"))
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

    async def _run_file_op(self, active: Active, command: Command) -> None:
        """Run a read_file, write_file, list_dir, search or glob confined to the allowed root
        holding its path (:mod:`endpointd.commands.fileops`): no denied directory is walked
        through, and what the open really reached is judged again before a byte moves
        (``judge``)."""
        from endpointd.guard.files import root_of
        from endpointd.rules.terms import FileOp

        active.spool.mkdir(parents=True, exist_ok=True, mode=0o700)
        writer = SpoolWriter(active.spool)
        active.local_task = True
        policy = self.policy
        request = command.op
        assert isinstance(request, ReadFile | WriteFile | ListDir | Search | Glob)
        kind, path = request.KIND, request.path
        op: FileOp = (
            "write" if kind == "write_file" else "list" if kind in ("list_dir", "glob") else "read"
        )

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

        ticket, workspaces_root = command.ticket_id, str(policy.workspaces_root)

        def judge(real: str) -> str | None:
            """The rule refusing what the operation really reached, or None: the decision
            at the start, again, on the real path (never another ticket's workspace)."""
            if tickets.foreign(ticket, real, workspaces_root) is not None:
                return tickets.RULE
            return verdict(policy.check_path(real, op))

        def entry_judge(real: str) -> str | None:
            """A listing's entries and subdirectories: as :func:`judge`, except that
            default_action, which judged the listing as a whole, does not hide them."""
            if tickets.foreign(ticket, real, workspaces_root) is not None:
                return tickets.RULE
            decision = policy.check_path(real, "list")
            return None if decision.rule == "default_action" else verdict(decision)

        roots = policy.operation_roots(path)
        bound = tickets.bound_workspace(self.workspaces.store, command)
        if bound is not None:
            # A ticket's operation inside its own workspace walks from there: no link out
            # of it is followed, even to elsewhere in the allowed root holding it.
            roots = [bound, *roots]
        root = root_of(path, roots)
        try:
            if root is None:
                result = OpResult(1, f"{kind} path {path} is outside the allowed roots")
            elif isinstance(request, ReadFile):
                result = await asyncio.to_thread(
                    read_file,
                    request,
                    writer,
                    root=root,
                    denied=policy.denied_rule,
                    judge=judge,
                )
            elif isinstance(request, Search | Glob):
                # Each file a search reads, and each one a glob names, is judged like a
                # read_file or a listing entry of its own.
                result = await asyncio.to_thread(
                    search.run,
                    request,
                    writer,
                    root=root,
                    denied=policy.denied_rule,
                    judge=judge,
                    entries=entry_judge,
                    max_output=active.max_output,
                )
            elif isinstance(request, ListDir):
                result = await asyncio.to_thread(
                    list_dir,
                    request,
                    writer,
                    root=root,
                    denied=policy.denied_rule,
                    judge=judge,
                    entries=entry_judge,
                )
            else:
                result = await asyncio.to_thread(
                    write_file,
                    request,
                    root=root,
                    denied=policy.denied_rule,
                    judge=judge,
                )
        finally:
            writer.close()
            active.local_task = False
        self._finish_op(active, result, total=writer.total)

    async def _workspace_op(self, active: Active, op: PrepareWorkspace | ReleaseWorkspace) -> None:
        """Prepare (the answer on the DATA stream) or release a ticket's workspace."""
        active.spool.mkdir(parents=True, exist_ok=True, mode=0o700)
        writer = SpoolWriter(active.spool)
        active.local_task = True
        result = OpResult()
        try:
            if isinstance(op, ReleaseWorkspace):
                await operations.release(self.workspaces, op, self.policy)
            else:
                answer = await operations.prepare(
                    self.workspaces,
                    op,
                    self.policy,
                    approved=active.approved,
                    run_setup=lambda plan: self._workspace_setup(active, plan),
                    stored_credential=lambda url: self._stored_git_credential(active, url),
                )
                writer.append(STREAM_DATA, answer)
        except WorkspaceError as exc:
            result = OpResult(1, str(exc))
        except Exception as exc:  # a bug or OS failure is this command's, not the daemon's
            log.exception("%s failed", op.KIND)
            result = OpResult(1, f"endpointd could not {op.KIND.replace('_', ' ')}: {exc}")
        finally:
            writer.close()
            active.local_task = False
        self._finish_op(active, result, total=writer.total)

    @contextlib.asynccontextmanager
    async def _stored_git_credential(
        self, active: Active, url: str
    ) -> AsyncIterator[FetchAuth | None]:
        """endpointd's git helper, served while a workspace's fetch runs, for the first
        stored credential whose policy ``hosts`` name ``url``'s host (https); None when
        there is none. The owner's other credential helpers are switched off for it, so
        the value never reaches their credential storage."""
        rules, store = self.policy.rules, self.credentials
        where = https_authority(url)
        if rules is None or store is None or where is None:
            yield None
            return
        stored = set(await asyncio.to_thread(store.names))
        name = next(
            (
                n
                for n, scope in rules.credentials.items()
                if n in stored and host_matches(scope.hosts, *where, default_port=443)
            ),
            None,
        )
        value = await asyncio.to_thread(store.get, name) if name is not None else None
        self._redactor_checked = float("-inf")  # its value masked in what git says
        if name is None or value is None or not self.redactor().covers([value]):
            yield None
            return
        pid: list[int] = []
        prepared = delivery.prepare(
            active.spool,
            (CredentialRef(name, Delivery.GIT_HELPER),),
            {name: value},
            scopes=rules.credentials,
            root_pid=lambda: pid[-1] if pid else None,
        )
        try:
            await prepared.start()
            with contextlib.suppress(CredentialError, OSError):
                store.touch(name)
            yield FetchAuth(prepared.apply({}), pid.append)
        finally:
            prepared.close()

    async def _workspace_setup(self, active: Active, plan: SetupPlan) -> Setup:
        """Run a new workspace's setup step like a command: judged by the policy, in the
        workspace's sandbox, under its own supervisor."""
        spool = active.spool / "setup"
        check = Command(command_id=active.command_id, op=Exec(argv=plan.argv, cwd=plan.cwd))
        decision = self.policy.check(check)
        if decision.action != "allow":
            return Setup(ran=False, output_tail=f"not run: {decision.message}")
        rules = self.policy.rules
        tmp = private_tmpdir(spool)
        pid: list[int] = []
        egress: delivery.Prepared | None = None
        try:
            if rules is not None and rules.network == "proxy":
                egress = delivery.prepare(
                    spool,
                    (),
                    {},
                    egress=Egress(network="proxy", allow_hosts=rules.proxy_hosts),
                    directory=tmp,
                    root_pid=lambda: pid[0] if pid else None,
                )
                await egress.start()
            op = active.command.op if active.command is not None else None
            planned = self._plan_sandbox(
                plan.cwd,
                tmp,
                egress.proxy_port if egress else None,
                ticket=op.ticket_id if isinstance(op, PrepareWorkspace) else "",
            )
            if isinstance(planned, tuple):
                return Setup(ran=False, output_tail=f"not run: {planned[0].message}")
            return await setup.run(
                plan.argv,
                plan.cwd,
                spool=spool,
                confinement=planned,
                limits=self._exec_limits(),
                passed_env=rules.env.passed if rules is not None else (),
                redact=self.redact_text,
                delivery=egress,
                on_started=pid.append,
            )
        except (delivery.DeliveryError, OSError) as exc:
            return Setup(ran=False, output_tail=f"not run: {exc}")
        finally:
            if egress is not None:
                egress.close()

    def _cancel(self, cancel: Cancel) -> OpResult:
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
                refused(
                    target_id,
                    Refusal(
                        Reason.APPROVAL_DENIED,
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
