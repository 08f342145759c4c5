"""Spares that make a confined command's PID namespace while they wait (process/nsinit.py).

The namespace and its init exist before the command does; these tests check that this
changes nothing a command or the daemon can see: a confined command still gets a namespace
of its own, an unconfined one still runs in the host's, and the early init holds none of
the supervisor's fds (the daemon learns of a command's end from its socket's EOF).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from endpointd.guard import sandbox
from endpointd.process.executor import ExecLimits, Zygote, exec_spec, private_tmpdir
from endpointd.rules.tables import Rules
from endpointd.spool import ExitStatus, read_all
from superagent_shared.messages import Exec
from tests.support.helpers import assert_eventually

pytestmark = pytest.mark.skipif(
    not sandbox.support().private_proc, reason="needs PID namespaces (Linux)"
)


@pytest.fixture
async def prepared() -> AsyncIterator[Zygote]:
    z = Zygote(prepare_namespaces=True)
    z.ensure_started()
    try:
        await assert_eventually(z.ready, timeout=20, message="the zygote never became ready")
        yield z
    finally:
        z.stop()


def _spec(spool: Path, argv: list[str], cwd: Path, *, confined: bool) -> dict[str, object]:
    confinement = None
    if confined:
        confinement = sandbox.plan(
            Rules(), denied=[], workspace=str(cwd), tmpdir=str(private_tmpdir(spool))
        )
    return exec_spec(
        spool,
        Exec(argv=tuple(argv), cwd=str(cwd)),
        limits=ExecLimits(max_timeout_seconds=60),
        default_cwd=cwd,
        confinement=confinement,
    )


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False


async def _spare_with_init(zygote: Zygote) -> tuple[int, int]:
    """The next spare's pid and its prepared init's."""

    def init_of_next_spare() -> tuple[int, int] | None:
        zygote.ready()  # takes in the spares the zygote sent
        if not zygote._spares:
            return None
        spare = zygote._spares[0][0]
        children = Path(f"/proc/{spare}/task/{spare}/children").read_text().split()
        return (spare, int(children[0])) if children else None

    found: tuple[int, int] | None = await assert_eventually(init_of_next_spare, timeout=15)
    assert found is not None
    return found


async def _run(zygote: Zygote, spec: dict[str, object], spool: Path) -> bytes:
    _, done = await zygote.launch(spool, spec)
    await assert_eventually(lambda: _closed(done), timeout=15)
    done.close()
    status = ExitStatus.read(spool)
    assert status is not None
    assert status.exit_code == 0, status
    return b"".join(data for _, data in read_all(spool))


async def test_a_confined_command_gets_the_prepared_namespace_and_nothing_else(
    prepared: Zygote, tmp_path: Path
) -> None:
    spare, init = await _spare_with_init(prepared)
    # The early init holds only its own socket to the supervisor: not the supervisor's
    # socket to the daemon, whose EOF is how the daemon learns that a command ended.

    def sockets() -> list[str]:
        fds = [os.readlink(f"/proc/{init}/fd/{fd}") for fd in os.listdir(f"/proc/{init}/fd")]
        return [t for t in fds if t.startswith("socket:")]

    # (Just forked, it still has all of the supervisor's; it closes them before it waits.)
    await assert_eventually(lambda: len(sockets()) == 1, timeout=15)
    prepared_namespace = os.readlink(f"/proc/{init}/ns/pid")
    assert prepared_namespace != os.readlink("/proc/self/ns/pid")

    spool = tmp_path / "spool"
    out = await _run(
        prepared,
        _spec(spool, ["sh", "-c", "echo $$; readlink /proc/self/ns/pid"], tmp_path, confined=True),
        spool,
    )
    pid_inside, namespace = out.decode().split()
    assert pid_inside == "2"  # the command, under the namespace's init
    assert namespace == prepared_namespace
    await assert_eventually(lambda: not os.path.exists(f"/proc/{spare}"), timeout=15)


async def test_an_unconfined_command_in_a_prepared_spare_runs_in_the_hosts_namespaces(
    prepared: Zygote, tmp_path: Path
) -> None:
    _, init = await _spare_with_init(prepared)
    spool = tmp_path / "spool"
    out = await _run(
        prepared,
        _spec(
            spool, ["readlink", "/proc/self/ns/pid", "/proc/self/ns/mnt"], tmp_path, confined=False
        ),
        spool,
    )
    assert out.decode().split() == [
        os.readlink("/proc/self/ns/pid"),
        os.readlink("/proc/self/ns/mnt"),
    ]
    # The init that was not needed is gone, and its namespace with it.
    await assert_eventually(lambda: not os.path.exists(f"/proc/{init}"), timeout=15)


async def test_a_spare_taught_other_read_rules_applies_the_commands_own(tmp_path: Path) -> None:
    # One spare at a time, so that the order is known: the first launch teaches the zygote
    # (after asking for the second spare), so the third spare is the first taught one, and it
    # was taught "everything is readable" while its command must not read `secret`.
    zygote = Zygote(prepare_namespaces=True, spares=1)
    zygote.ensure_started()
    # In the workspace: what lies elsewhere is not in a command's view at all.
    secret = tmp_path / "ws" / "secret"
    secret.mkdir(parents=True)
    (secret / "key").write_text("canary-7d1f")
    try:
        await assert_eventually(zygote.ready, timeout=20)
        outputs = []
        for n, denied in enumerate([[], [], [str(secret)], [str(secret)]]):
            spool = tmp_path / f"spool{n}"
            spec = exec_spec(
                spool,
                Exec(
                    argv=("sh", "-c", f"cat {secret / 'key'} || echo refused"),
                    cwd=str(tmp_path / "ws"),
                ),
                limits=ExecLimits(max_timeout_seconds=60),
                default_cwd=tmp_path,
                confinement=sandbox.plan(
                    Rules(),
                    denied=denied,
                    workspace=str(tmp_path / "ws"),
                    tmpdir=str(private_tmpdir(spool)),
                ),
            )
            outputs.append(await _run(zygote, spec, spool))
    finally:
        zygote.stop()
    assert [b"canary-7d1f" in out for out in outputs] == [True, True, False, False]
    assert [b"refused" in out for out in outputs] == [False, False, True, True]


def test_an_unconfined_command_handed_to_a_prepared_supervisor_stays_in_its_namespace(
    tmp_path: Path,
) -> None:
    # The daemon never does this (Zygote.launch picks an unprepared spare), but a prepared
    # supervisor can no longer start anything outside its namespace: it must run the command
    # there (more confined than asked), never fail open or lose it.
    script = """
import os, sys
sys.path.append(sys.argv[1])
from endpointd.process import supervisor
supervisor.become_subreaper()
supervisor.prepare_init(None)
stdin = os.open(os.devnull, os.O_RDONLY)
pgid, out, err = supervisor._spawn(
    ["sh", "-c", "echo $$; readlink /proc/self/ns/pid"], sys.argv[2], {"PATH": "/usr/bin:/bin"},
    stdin, None,
)
data = b""
while chunk := os.read(out, 4096):
    data += chunk
sys.stdout.write(data.decode())
"""
    package_root = str(Path(__file__).resolve().parents[3] / "endpointd")
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", script, package_root, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    pid_inside, namespace = done.stdout.split()
    assert pid_inside == "2"
    assert namespace != os.readlink("/proc/self/ns/pid")
