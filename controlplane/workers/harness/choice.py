"""Who works a ticket: the built-in worker, or a coding-agent CLI (a *harness*) on its
device, chosen once and kept on the ticket (``tickets.harness``).

In order: what a person asked for (the router's ``create_ticket(harness=…)``); the
repository's ``.superagent/config`` (``[harness] default``); the device's policy
(``[harness] default``, reported with its repositories); else ``builtin``. A harness is
only ever chosen among those the device reported as installed and allowed by its owner's
policy: the device refuses any other anyway, and saying so here gives a clear report
instead of a refused command. A person's explicit ask for one the device cannot run is not
silently replaced by another worker: the round ends blocked, saying how to allow it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from controlplane.db.pool import Db
from controlplane.gateway import repositories
from controlplane.tickets import store
from controlplane.workers.harness.repo_config import RepoConfig

BUILTIN = "builtin"
# The harnesses whose event streams a harness round reads (controlplane.workers.harness.streams).
SUPPORTED = ("qwen", "codex", "claude")
BACKENDS = (BUILTIN, *SUPPORTED)


@dataclass(frozen=True)
class Backend:
    name: str  # BUILTIN or a harness's name
    why: str  # for the log and the session: how it was chosen
    problem: str | None = None  # set: the ticket asked for a harness its device cannot run


def _cannot(name: str, device: str, reported: list[dict[str, Any]]) -> str | None:
    """Why ``device`` cannot run the harness ``name``, or None when it can."""
    if name not in SUPPORTED:
        return f"{name!r} is not a harness this control plane can drive ({', '.join(SUPPORTED)})"
    found = next((h for h in reported if h.get("name") == name), None)
    if found is None:
        return (
            f"the device {device} has no {name} installed (or runs an endpointd too old to say); "
            f"`endpointd harness list` on it shows what it has"
        )
    if not found.get("allowed"):
        return (
            f"the device {device} has {name} but its owner's policy does not allow it: add "
            f'`[harness] allowed = ["{name}"]` to its policy.toml'
        )
    return None


async def choose(
    db: Db, ticket_id: str, device_id: str | None, device: str, config: RepoConfig
) -> Backend:
    """The ticket's backend, recorded on it the first time."""
    asked = await db.fetchval("SELECT harness FROM tickets WHERE id = $1", ticket_id)
    reported, default = await repositories.harnesses_of(db, device_id)
    if asked == BUILTIN:
        return Backend(BUILTIN, "the ticket's")
    if asked:
        problem = _cannot(asked, device, reported)
        return Backend(asked, "asked for", problem)
    chosen = Backend(BUILTIN, "the default")
    for name, why in ((config.harness, "the repository's"), (default, "the device's default")):
        if name and _cannot(name, device, reported) is None:
            chosen = Backend(name, why)
            break
    await store.choose_harness(db, ticket_id, chosen.name)
    return chosen
