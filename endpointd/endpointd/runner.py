"""`endpointd run`: assemble the daemon and run it until SIGTERM/SIGINT.

Parts run as tasks - the connection loop, the starter (commands in seq order), the monitor
(running commands' output and exit) - and the first one to fail takes the process down
loudly, so the service manager restarts it. Shutdown stops intake and leaves running
commands alone: their supervisors finish them under their timeouts, and the next daemon
re-attaches and reports them. Exactly one daemon may use a state dir at a time (a lock
file), since two would both start the same journaled commands.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import IO

from endpointd.commands.daemon import Daemon
from endpointd.config import load_config
from endpointd.errors import ConfigError, KeyStorageError
from endpointd.guard import daemon_programs
from endpointd.guard.policy import Policy, load_policy
from endpointd.journal import JOURNAL_FILE, Journal
from endpointd.keys import load_key
from endpointd.link.connection import connect_forever
from endpointd.paths import ensure_private_dir
from endpointd.process.executor import ExecLimits
from endpointd.secrets.store import CredentialStore
from endpointd.status import StatusReporter

log = logging.getLogger(__name__)

LOCK_FILE = "daemon.lock"


class RedactingFilter(logging.Filter):
    """Masks credential values in every record a handler writes."""

    def __init__(self, redact: Callable[[str], str]) -> None:
        super().__init__()
        self.redact = redact

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = self.redact(message)
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        if masked != message:
            record.msg, record.args = masked, None
        return True


def acquire_lock(state_directory: Path) -> IO[str]:
    handle = open(state_directory / LOCK_FILE, "a+")  # noqa: SIM115 - held for the lifetime
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise ConfigError(
            f"another endpointd (pid {holder}) is already running with state dir {state_directory}"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle


async def run_daemon(
    *,
    config_directory: Path,
    state_directory: Path,
    max_timeout_seconds: int | None,
    parent_pid: int | None = None,
) -> None:
    config = load_config(config_directory)
    key = load_key(config.key)
    if key.public_raw.hex() != config.public_key:
        raise KeyStorageError(
            "the stored device key does not match the paired public key; re-pair with"
            " `endpointd unpair` then `endpointd pair`"
        )
    ensure_private_dir(state_directory)
    ensure_private_dir(state_directory / "spool")
    lock = acquire_lock(state_directory)
    journal = Journal(state_directory / JOURNAL_FILE)
    status = StatusReporter(
        state_directory, server=config.server_url, device_id=config.device_id, state="starting"
    )
    limits = ExecLimits(max_timeout_seconds=max_timeout_seconds or config.default_timeout_seconds)
    policy = load_policy(config_directory, state_directory=state_directory)
    _resolve_programs(policy, config_directory, state_directory)
    daemon = Daemon(
        config,
        state_directory=state_directory,
        journal=journal,
        policy=policy,
        status=status,
        limits=limits,
        credentials=CredentialStore(config_directory),
    )
    # endpointd's own log lines leave the device too (support bundles, journald shipping):
    # they are masked like command output.
    redacting = RedactingFilter(daemon.redact_text)
    for handler in logging.getLogger().handlers:
        handler.addFilter(redacting)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    try:
        daemon.recover()
        tasks = [
            asyncio.create_task(daemon.monitor(), name="endpointd-monitor"),
            asyncio.create_task(daemon.starter(), name="endpointd-starter"),
            asyncio.create_task(connect_forever(daemon, key, stopping), name="endpointd-connect"),
            asyncio.create_task(stopping.wait(), name="endpointd-stop"),
        ]
        if parent_pid is not None:
            tasks.append(asyncio.create_task(_parent_gone(parent_pid), name="endpointd-parent"))
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        running = sum(1 for a in daemon.commands.values() if a.state == "running")
        log.info("stopping; %d running command(s) continue under their supervisors", running)
    finally:
        daemon.close()
        with contextlib.suppress(OSError):
            status.update(state="stopped")
        journal.close()
        lock.close()


def _resolve_programs(policy: Policy, config_directory: Path, state_directory: Path) -> None:
    """git, ripgrep, ssh and the rest, found now on directories no command can write."""
    found = daemon_programs.configure_for(policy, config_directory, state_directory)
    for directory, why in found.skipped:
        log.info("not running programs from %s on PATH: %s", directory, why)
    log.info("git: %s; rg: %s", found.which("git") or "none", found.which("rg") or "none")


async def _parent_gone(parent_pid: int) -> None:
    """Return once ``parent_pid`` is no longer our parent: the supervisor died, even by
    SIGKILL, and a device it started must not outlive it (a second one would follow)."""
    while os.getppid() == parent_pid:  # noqa: ASYNC110 - no portable parent-death event
        await asyncio.sleep(1.0)
    log.warning("parent %d is gone; stopping", parent_pid)
