"""The outbox: every external action happens here, after the transaction that decided it.

``outbox.enqueue`` writes an effect in the caller's transaction; ``runner.EffectRunner``
(on any replica) claims ready effects with ``FOR UPDATE SKIP LOCKED``, executes their
handlers, and deletes each one only if its generation still matches (docs/architecture.md,
*Rules everything relies on*, rule 1).
"""

from controlplane.effects.handlers import ClaimedEffect, Handler, Handlers, Postpone
from controlplane.effects.outbox import (
    EffectRef,
    enqueue,
    enqueue_many,
)

__all__ = [
    "ClaimedEffect",
    "EffectRef",
    "Handler",
    "Handlers",
    "Postpone",
    "enqueue",
    "enqueue_many",
]
