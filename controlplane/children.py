"""A child process of ``superagent up``: started, restarted when it dies, stopped.

On one machine ``up`` is the whole deployment, so what a deployment runs beside its
replicas (the watchdog; this machine's own endpointd) runs here as processes of their own:
a replica that wedges does not wedge them. A child that exits is started again after a
backoff with jitter; the backoff resets once a child has stayed up a while.

Each child is told the parent's pid (``--parent-pid``) and exits when the parent is gone,
so even a SIGKILLed ``up`` leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from abc import abstractmethod
from collections.abc import Mapping, Sequence

from controlplane.services import Service, sleep_unless
from superagent_shared import backoff

log = logging.getLogger(__name__)

# A child that ran this long was healthy: its next failure starts the backoff over.
_HEALTHY_SECONDS = 60.0


class SupervisedChild(Service):
    """Runs :meth:`argv` under :meth:`env` until stopped, restarting it when it exits."""

    # What the log lines call it ("watchdog", "this machine's endpointd").
    label = "child"

    def __init__(self, *, backoff_cap: float) -> None:
        super().__init__()
        self.backoff_cap = backoff_cap
        self.process: asyncio.subprocess.Process | None = None
        self.restarts = 0

    @abstractmethod
    def argv(self) -> Sequence[str]:
        """The child's command line; it must honour ``--parent-pid``."""

    def env(self) -> Mapping[str, str]:
        return os.environ

    def cwd(self) -> str | None:
        return None

    async def prepare(self) -> bool:
        """Run once before the first start; False: never start it (the reason was said)."""
        return True

    async def run(self) -> None:
        if not await self.prepare():
            # The rest of `up` goes on without this child: idle until stopped, since a
            # service that returns is taken for a crash.
            await self.stopping.wait()
            return
        failures = 0
        while not self.stopping.is_set():
            started = time.monotonic()
            try:
                code = await self._run_once()
            except OSError as exc:  # could not even start it: same as a quick death
                log.warning("could not start %s (%s)", self.label, exc)
                code = None
            if self.stopping.is_set():
                return
            failures = 1 if time.monotonic() - started >= _HEALTHY_SECONDS else failures + 1
            wait = backoff.delay(failures, base=1.0, cap=self.backoff_cap)
            log.warning("%s exited (code %s); restarting in %.1fs", self.label, code, wait)
            if await sleep_unless(self.stopping, wait):
                return
            self.restarts += 1

    async def _run_once(self) -> int | None:
        self.process = await asyncio.create_subprocess_exec(
            *self.argv(),
            env=dict(self.env()),
            cwd=self.cwd(),
            # Its log lines go where ours go (same stderr); it reads nothing from us.
            stdin=asyncio.subprocess.DEVNULL,
            # Its own process group: a Ctrl-C in the terminal reaches `up` alone, which
            # stops the child in order (one "stopping" line, not two racing shutdowns).
            start_new_session=True,
        )
        log.info("%s started (pid %d)", self.label, self.process.pid)
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
            log.warning("%s did not stop on SIGTERM; killing it", self.label)
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
