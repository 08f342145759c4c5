"""The watchdog as a child of ``superagent up``: started, restarted when it dies, stopped.

DESIGN.md §6 wants the watchdog outside the replicas. On one machine ``up`` is the whole
deployment, so it runs ``superagent watchdog`` as a process of its own (its own event loop,
its own pool): a replica that wedges does not wedge its watchdog. If the child exits, it is
started again after a backoff with jitter; the backoff resets once a child has stayed up a
while. Deployments (``superagent serve``) run ``superagent watchdog`` separately and never
start this.

The child is told the parent's pid (``--parent-pid``) and exits when the parent is gone, so
even a SIGKILLed ``up`` leaves no watchdog behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time

from controlplane.services import Service, sleep_unless
from superagent_shared import backoff

log = logging.getLogger(__name__)

# A child that ran this long was healthy: its next failure starts the backoff over.
_HEALTHY_SECONDS = 60.0


class WatchdogChild(Service):
    name = "watchdog-child"

    def __init__(self, database_url: str, *, backoff_cap: float) -> None:
        super().__init__()
        self.database_url = database_url
        self.backoff_cap = backoff_cap
        self.process: asyncio.subprocess.Process | None = None
        self.restarts = 0

    async def run(self) -> None:
        failures = 0
        while not self.stopping.is_set():
            started = time.monotonic()
            try:
                code = await self._run_once()
            except OSError as exc:  # could not even start it: same as a quick death
                log.warning("could not start the watchdog (%s)", exc)
                code = None
            if self.stopping.is_set():
                return
            failures = 1 if time.monotonic() - started >= _HEALTHY_SECONDS else failures + 1
            wait = backoff.delay(failures, base=1.0, cap=self.backoff_cap)
            log.warning("watchdog exited (code %s); restarting in %.1fs", code, wait)
            if await sleep_unless(self.stopping, wait):
                return
            self.restarts += 1

    async def _run_once(self) -> int | None:
        env = {**os.environ, "DATABASE_URL": self.database_url}
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "controlplane.cli",
            "watchdog",
            "--parent-pid",
            str(os.getpid()),
            env=env,
            # Its log lines go where ours go (same stderr); it reads nothing from us.
            stdin=asyncio.subprocess.DEVNULL,
            # Its own process group: a Ctrl-C in the terminal reaches `up` alone, which
            # stops the child in order (one "stopping" line, not two racing shutdowns).
            start_new_session=True,
        )
        log.info("watchdog started (pid %d)", self.process.pid)
        exited = asyncio.create_task(self.process.wait())
        stopping = asyncio.create_task(self.stopping.wait())
        try:
            await asyncio.wait([exited, stopping], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if not exited.done():
            await self._terminate(exited)
        return self.process.returncode

    async def _terminate(self, exited: asyncio.Task[int]) -> None:
        """SIGTERM, then SIGKILL if it has not gone within a few seconds."""
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):
            self.process.terminate()
        done, _ = await asyncio.wait([exited], timeout=3.0)
        if not done:
            log.warning("watchdog did not stop on SIGTERM; killing it")
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            await asyncio.wait([exited], timeout=2.0)

    async def stop(self, timeout: float = 5.0) -> None:
        await super().stop(timeout)
        # Cancelled mid-wait, or left behind: the child goes regardless.
        process = self.process
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
