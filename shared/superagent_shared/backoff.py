"""Retry delays, the one module for both programs: exponential, capped, jittered.

:func:`delay` is the stateless form (retry number ``attempt`` of an effect, a model call, a
service loop); :class:`Backoff` keeps the count for a loop that redials, as endpointd does
with the gateway ("1 s ×1.6 ±20 % up to 120 s": docs/architecture.md, *Device gateway and
endpointd*). Jitter keeps many retriers, a fleet of daemons cut off by the same outage above
all, from marching in step. Only the standard library is used: this module ships in the
daemon wheel.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


def delay(
    attempt: int, *, base: float = 1.0, factor: float = 2.0, cap: float = 60.0, jitter: float = 0.2
) -> float:
    """Seconds to wait before retry number ``attempt`` (1-based): ``base * factor**(attempt-1)``,
    capped at ``cap``, then scaled by a random factor in ``[1 - jitter, 1 + jitter]``."""
    return _jittered(_capped(base, factor, attempt - 1, cap), jitter)


def _capped(base: float, factor: float, exponent: int, cap: float) -> float:
    # Clamped: a float power overflows long before any real retry count gets there.
    return min(cap, base * factor ** min(max(exponent, 0), 200))


def _jittered(seconds: float, jitter: float) -> float:
    return seconds * random.uniform(1.0 - jitter, 1.0 + jitter)  # noqa: S311 - not security


@dataclass
class Backoff:
    """Exponential backoff with jitter; call :meth:`next_delay` before each retry.

    The first delay is ``initial`` seconds, each later one ``factor`` times the previous
    (before jitter), capped at ``cap``. Jitter scales every delay by a random factor in
    ``[1 - jitter, 1 + jitter]`` so that a fleet of daemons cut off by the same outage does
    not reconnect in lockstep when the server comes back. :meth:`reset` after a connection
    that proved healthy, so one blip after days of uptime retries after ~1 s again.
    """

    initial: float = 1.0
    factor: float = 1.6
    cap: float = 120.0
    jitter: float = 0.2
    _attempt: int = field(default=0, init=False)

    @property
    def attempt(self) -> int:
        """How many delays have been handed out since the last reset."""
        return self._attempt

    def peek(self) -> float:
        """The un-jittered delay the next call would be based on."""
        return _capped(self.initial, self.factor, self._attempt, self.cap)

    def next_delay(self) -> float:
        base = self.peek()
        self._attempt += 1
        return _jittered(base, self.jitter)

    def reset(self) -> None:
        self._attempt = 0
