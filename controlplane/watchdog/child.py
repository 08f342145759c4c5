"""The watchdog as a child of ``superagent up`` (controlplane.children).

The watchdog runs outside the replicas (docs/architecture.md, *The watchdog*). On one
machine ``up`` is the whole deployment, so it runs ``superagent watchdog`` as a process of
its own (its own event loop, its own pool). Deployments (``superagent serve``) run
``superagent watchdog`` separately and never start this.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from controlplane.children import SupervisedChild


class WatchdogChild(SupervisedChild):
    name = "watchdog-child"
    label = "watchdog"

    def __init__(self, database_url: str, *, backoff_cap: float) -> None:
        super().__init__(backoff_cap=backoff_cap)
        self.database_url = database_url

    def argv(self) -> Sequence[str]:
        return (
            sys.executable,
            "-m",
            "controlplane.cli",
            "watchdog",
            "--parent-pid",
            str(os.getpid()),
        )

    def env(self) -> Mapping[str, str]:
        return {**os.environ, "DATABASE_URL": self.database_url}
