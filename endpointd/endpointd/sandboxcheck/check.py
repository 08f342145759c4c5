"""`endpointd sandbox check`: run the escape-probe suite under the owner's own policy.

Not a simulation: the probes run as one command would, through the daemon's own pieces.
The policy is loaded as the daemon loads it; the command's sandbox is planned by the
daemon's own :meth:`endpointd.guard.policy.Policy.confinement` for a ticket workspace
(a real worktree, with the grants :mod:`endpointd.workspaces.grants` gives one) and a
private TMPDIR; under ``network = "proxy"`` endpointd's egress proxy is started for it as
for any command (:func:`endpointd.secrets.delivery.prepare`); the supervisor is started
by :func:`endpointd.process.executor.start_supervisor` from the spec
:func:`~endpointd.process.executor.exec_spec` builds, so the PID namespace, Landlock and
seccomp are applied exactly as to a command the control plane sent. Only the daemon's
bookkeeping (journal, stream, approvals) is left out, and the policy's ``[[commands]]``
rules, which judge a command's text and are not what the check is about.

What the probes try is :data:`endpointd.sandboxcheck.suite.SUITE`; what they aim at is
planted by :class:`endpointd.sandboxcheck.scene.Scene` and removed afterwards. The result
is saved for `endpointd status` and `superagent doctor` (:mod:`endpointd.checkresult`).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import secrets
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from endpointd import checkresult
from endpointd.checkresult import CheckResult, ClassResult
from endpointd.errors import EndpointdError
from endpointd.guard import sandbox
from endpointd.guard.policy import Policy
from endpointd.paths import ensure_private_dir
from endpointd.process.executor import ExecLimits, exec_spec, private_tmpdir, start_supervisor
from endpointd.sandboxcheck import program
from endpointd.sandboxcheck.scene import MARK, Scene, SceneError
from endpointd.sandboxcheck.suite import SUITE, Probe, ProbeClass
from endpointd.secrets import delivery
from endpointd.secrets.proxy import Egress
from endpointd.spool import STREAM_STDERR, STREAM_STDOUT, ExitStatus, read_all
from superagent_shared.messages import Exec

TYPE_CHECKING = False
if TYPE_CHECKING:
    from endpointd.rules.tables import Rules

# The probe command's own limit (its connects time out after a second each), and how
# long the check waits for its supervisor beyond that before giving up on it.
COMMAND_TIMEOUT = 20
_WAIT_MARGIN = 10.0


class CheckError(EndpointdError):
    """The check cannot run here (the message says why and what to do)."""


@dataclass
class Run:
    """One run's probe outcomes by probe id, and what went wrong if the probes did not run."""

    outcomes: dict[int, tuple[bool, str]] = field(default_factory=dict)
    failure: str = ""


def controlplane_state_dir(endpointd_state: Path) -> Path:
    """Where the control plane on this machine keeps its state (embedded Postgres, the
    admin token): the directory holding `superagent up --device`'s endpointd when this is
    that one, else ``$SUPERAGENT_STATE_DIR``, else its default."""
    if endpointd_state.name == "state" and endpointd_state.parent.name == "device":
        return endpointd_state.parent.parent
    configured = os.environ.get("SUPERAGENT_STATE_DIR")
    if configured and os.path.isabs(os.path.expanduser(configured)):
        return Path(os.path.expanduser(configured))
    return Path(os.path.expanduser("~/.local/share/superagent"))


def run_check(
    policy: Policy, *, config_directory: Path, state_directory: Path, data_directory: Path
) -> CheckResult:
    """Plant the scene, run the probes confined, judge them, save and return the result."""
    rules = policy.rules
    if rules is None or policy.error is not None:
        raise CheckError(
            f"the policy cannot be used: {policy.error} (every command is refused until it"
            " is fixed, so there is nothing to check)"
        )
    spool = state_directory / "sandbox-check" / secrets.token_hex(6)
    scene = Scene(
        home=Path(os.path.expanduser("~")),
        workspaces_root=policy.workspaces_root,
        scratch_parent=data_directory / MARK,
        endpointd_state=state_directory,
        endpointd_config=config_directory,
        controlplane_state=controlplane_state_dir(state_directory),
    )
    try:
        ensure_private_dir(spool.parent.parent)  # the state dir, 0700 as the daemon makes it
        ensure_private_dir(spool.parent)
        spool.mkdir(mode=0o700)
        run, unenforced = asyncio.run(_with_proxy(policy, rules, scene, spool))
    except (SceneError, delivery.DeliveryError, OSError) as exc:
        raise CheckError(str(exc)) from None
    finally:
        scene.remove()
        shutil.rmtree(spool, ignore_errors=True)
        with contextlib.suppress(OSError):
            spool.parent.rmdir()
    result = CheckResult(
        checked_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        policy_sha256=policy.hash().hex(),
        sandbox=policy.sandbox_summary,
        classes=tuple(
            _judge(c, run, scene, rules.sandbox, rules.network, unenforced) for c in SUITE
        ),
    )
    try:
        checkresult.save(state_directory, result)
    except OSError as exc:
        raise CheckError(f"cannot save the result in {state_directory}: {exc}") from None
    return result


async def _with_proxy(
    policy: Policy, rules: Rules, scene: Scene, spool: Path
) -> tuple[Run, tuple[str, ...]]:
    """Under ``network = "proxy"``, endpointd's egress proxy for the probe command, served
    by this event loop while the probes run in a thread, as the daemon does for every
    command under "proxy" (commands/starter.py)."""
    supervisor: list[int] = []
    prepared: delivery.Prepared | None = None
    try:
        if rules.network == "proxy":
            prepared = delivery.prepare(
                spool,
                (),
                {},
                scopes=rules.credentials,
                egress=Egress(network=rules.network, allow_hosts=rules.proxy_hosts),
                directory=private_tmpdir(spool),
                root_pid=lambda: supervisor[0] if supervisor else None,
            )
            await prepared.start()
        return await asyncio.to_thread(_probe, policy, rules, scene, spool, prepared, supervisor)
    finally:
        if prepared is not None:
            prepared.close()


def _probe(
    policy: Policy,
    rules: Rules,
    scene: Scene,
    spool: Path,
    prepared: delivery.Prepared | None,
    supervisor: list[int],
) -> tuple[Run, tuple[str, ...]]:
    """Plant the scene, then :func:`run_probes`."""
    scene.plant(proxy_port=prepared.proxy_port if prepared is not None else None)
    return run_probes(policy, rules, scene, spool, prepared, supervisor)


def run_probes(
    policy: Policy,
    rules: Rules,
    scene: Scene,
    spool: Path,
    prepared: delivery.Prepared | None,
    supervisor: list[int],
) -> tuple[Run, tuple[str, ...]]:
    """Plan the probe command's sandbox as the daemon plans a command's, in the planted
    ``scene``'s ticket workspace, and run it; its outcomes, and what this machine could
    not enforce."""
    proxy_port = prepared.proxy_port if prepared is not None else None
    workspace = policy.workspace_for(str(scene.workspace))
    if workspace is None:
        raise CheckError(f"{scene.workspace} is not a ticket workspace under this policy")
    tmp = private_tmpdir(spool)
    try:
        # As a ticket's command (as the daemon plans one): the other tickets' workspaces
        # denied, its clone's git directory in view.
        confinement = policy.confinement(
            workspace=str(workspace),
            tmpdir=str(tmp),
            proxy_port=proxy_port,
            ticket=True,
            extra_write=scene.write_dirs,
            extra_write_files=scene.write_files,
            extra_read=scene.read_dirs,
        )
    except sandbox.SandboxUnavailable as exc:
        raise CheckError(f"every command is refused on this machine: {exc}") from None
    ex = Exec(
        argv=probe_argv(),
        cwd=str(workspace),
        stdin=probe_input(scene, allowed_egress=rules.network == "allow"),
        timeout_seconds=COMMAND_TIMEOUT,
    )
    spec = exec_spec(
        spool,
        ex,
        limits=ExecLimits(max_timeout_seconds=COMMAND_TIMEOUT, kill_grace_seconds=1),
        default_cwd=workspace,
        delivery=prepared,
        confinement=confinement,
        passed_env=rules.env.passed,
    )
    return _run(spool, spec, supervisor), confinement.unenforced


def probe_argv() -> tuple[str, ...]:
    """The probe command: the probe program's source, run by a bare interpreter."""
    return (_interpreter(), "-I", "-S", "-c", Path(program.__file__).read_text())


def probe_input(scene: Scene, *, allowed_egress: bool) -> bytes:
    """The probe command's stdin: its plan (see :mod:`endpointd.sandboxcheck.program`)."""
    plan = _plan(scene, allowed_egress=allowed_egress)
    return json.dumps([{"id": i, **p} for i, p in plan.items()]).encode()


def parse_output(stdout: bytes) -> dict[int, tuple[bool, str]]:
    """The probe program's lines: (succeeded, detail) by probe id; other lines ignored."""
    outcomes: dict[int, tuple[bool, str]] = {}
    for line in stdout.splitlines():
        with contextlib.suppress(ValueError, KeyError, TypeError):
            item = json.loads(line)
            outcomes[int(item["id"])] = (bool(item["ok"]), str(item["detail"]))
    return outcomes


def _interpreter() -> str:
    """The Python the probe program runs on: the real file behind this one (a venv's
    ``bin/python`` is a link), in the system's directories where it can be."""
    return os.path.realpath(sys.executable)


def _plan(scene: Scene, *, allowed_egress: bool) -> dict[int, dict[str, str]]:
    """The probes to run, by id (the position in the suite), with their targets."""
    out: dict[int, dict[str, str]] = {}
    for i, cls, probe in _probes():
        if cls.name == "egress" and allowed_egress:
            continue
        if probe.target and probe.target not in scene.targets:
            continue
        target = scene.targets.get(probe.target, "")
        out[i] = {"action": probe.action, "target": target, "token": scene.token}
    return out


def _probes() -> list[tuple[int, ProbeClass, Probe]]:
    """Every probe of the suite with its id (its position in the suite)."""
    pairs = [(cls, probe) for cls in SUITE for probe in cls.probes]
    return [(i, cls, probe) for i, (cls, probe) in enumerate(pairs)]


def _run(spool: Path, spec: dict[str, Any], supervisor: list[int]) -> Run:
    """Start the supervisor and wait for it (bounded); the probes' outcomes by id."""
    proc = start_supervisor(spool, spec)
    supervisor.append(proc.pid)
    try:
        proc.wait(COMMAND_TIMEOUT + _WAIT_MARGIN)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        proc.wait()
        return Run(failure="the probe command did not end in time")
    stdout = b"".join(data for stream, data in read_all(spool) if stream == STREAM_STDOUT)
    stderr = b"".join(data for stream, data in read_all(spool) if stream == STREAM_STDERR)
    run = Run(outcomes=parse_output(stdout))
    status = ExitStatus.read(spool)
    if status is None or status.exit_code != 0:
        why = (status.error if status is not None else "") or _last_line(stderr)
        code = status.exit_code if status is not None else "unknown"
        run.failure = f"the probe command failed (exit {code}): {why or 'no output'}"
    return run


def _last_line(data: bytes) -> str:
    lines = data.decode("utf-8", "replace").strip().splitlines()
    return lines[-1][:300] if lines else ""


def _judge(
    cls: ProbeClass,
    run: Run,
    scene: Scene,
    mode: str,
    network: str,
    unenforced: tuple[str, ...],
) -> ClassResult:
    if cls.name == "egress" and network == "allow":
        return ClassResult(
            cls.name,
            "allowed",
            detail='network = "allow" in policy.toml lets commands connect anywhere, loopback'
            ' services included; set network = "proxy" or "deny" to confine it',
        )
    escaped: list[str] = []
    missing: list[str] = []
    unchecked: list[str] = []
    for i, _, probe in (entry for entry in _probes() if entry[1] is cls):
        if probe.target and probe.target not in scene.targets:
            reason = scene.skipped.get(probe.target, "nothing to probe here")
            unchecked.append(f"{probe.what} ({reason})")
        elif i not in run.outcomes:
            missing.append(probe.what)
        elif run.outcomes[i][0]:
            escaped.append(f"{probe.what}: {run.outcomes[i][1]}")
    note = f"not checked here: {'; '.join(unchecked)}" if unchecked else ""
    if escaped:
        return ClassResult(cls.name, "escaped", tuple(escaped), _fix(cls, mode, unenforced), note)
    if missing:
        why = run.failure or "the probe program printed no result for them"
        return ClassResult(cls.name, "error", fix=why, detail=f"not run: {'; '.join(missing)}")
    return ClassResult(cls.name, "contained", detail=note)


def _fix(cls: ProbeClass, mode: str, unenforced: tuple[str, ...]) -> str:
    """The fix for an escaped class: the sandbox mode first when it is the cause."""
    if mode == "off":
        return 'sandbox = "off" in policy.toml: set sandbox = "required"'
    if unenforced:
        return f"this machine cannot enforce {'; '.join(unenforced)}; then: {cls.fix}"
    return cls.fix
