"""One item's failure, never the process's: classify it, log it once, put it on record.

Every loop that handles items (router turns, worker rounds, effects, channel events, device
messages, the console hub, the watchdog's checks) catches what goes wrong with one item and
hands it here. What the loop then does (retry with backoff, quarantine after N attempts) is
the loop's business; this module only says what kind of failure it was, writes the
``item_failures`` row ``/metrics`` counts, and logs it: one line for a model's failure, the
traceback for an exception in our own code (``internal``), which is a bug to fix.
"""

from __future__ import annotations

import logging
import traceback
from typing import Literal

from controlplane.db.pool import Db
from controlplane.errors import TransientError
from superagent_shared.ids import new_id

log = logging.getLogger(__name__)

FailureClass = Literal["transient", "context", "permanent", "malformed", "internal"]
MAX_ERROR = 2000  # characters of an error kept on record


def classify(exc: BaseException) -> FailureClass:
    """A model call's class; ``transient`` for a peer or the network that may answer later;
    what the exception says of itself (``failure_class``); else ``internal``: our own code
    raised it."""
    declared = _declared(exc)
    if declared is not None:
        return declared
    if isinstance(exc, TransientError | OSError):
        return "transient"
    return "internal"


def describe(exc: BaseException) -> str:
    """One line people can read: ``malformed: the answer has no choices``,
    ``internal: IndexError: list index out of range``."""
    declared = _declared(exc)
    if declared is not None and str(exc).startswith(f"{declared}: "):
        return str(exc)[:MAX_ERROR]  # it names its class itself (a model call's errors do)
    text = str(exc).splitlines()[0] if str(exc) else ""
    line = f"{classify(exc)}: {type(exc).__name__}" + (f": {text}" if text else "")
    return line[:MAX_ERROR]


def _declared(exc: BaseException) -> FailureClass | None:
    """The class an exception declares (``failure_class``: model errors, the outbox's
    Permanent), if it is one of ours other than ``internal``."""
    declared = getattr(exc, "failure_class", None)
    for known in _DECLARABLE:
        if declared == known:
            return known
    return None


_DECLARABLE: tuple[FailureClass, ...] = ("transient", "context", "permanent", "malformed")


def logged(logger: logging.Logger, loop: str, item_id: str, exc: BaseException, then: str) -> None:
    """Log the failure: with its traceback when it is our own bug."""
    if classify(exc) == "internal":
        logger.error(
            "%s: %s failed (%s); %s\n%s",
            loop,
            item_id,
            describe(exc),
            then,
            "".join(traceback.format_exception(exc)).rstrip(),
        )
    else:
        logger.warning("%s: %s failed (%s); %s", loop, item_id, describe(exc), then)


async def record(
    db: Db, loop: str, item_id: str, exc: BaseException, *, quarantined: bool = False
) -> FailureClass:
    """The failure on record (``item_failures``); returns its class."""
    kind = classify(exc)
    await db.execute(
        "INSERT INTO item_failures (id, loop, item_id, error_class, error, quarantined) "
        "VALUES ($1, $2, $3, $4, $5, $6)",
        new_id("ifl"),
        loop,
        item_id,
        kind,
        describe(exc),
        quarantined,
    )
    return kind
