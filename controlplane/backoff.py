"""Retry delays: exponential, capped, with jitter so that many retriers do not march in step."""

from __future__ import annotations

import random


def delay(attempt: int, *, base: float = 1.0, cap: float = 60.0, jitter: float = 0.2) -> float:
    """Seconds to wait before retry number ``attempt`` (1-based).

    ``base * 2**(attempt-1)``, capped at ``cap``, then scaled by a random factor in
    ``[1 - jitter, 1 + jitter]``.
    """
    exponent = min(max(attempt - 1, 0), 62)
    raw = min(cap, base * (2.0**exponent))
    return raw * random.uniform(1.0 - jitter, 1.0 + jitter)  # noqa: S311 - not security
