"""Reconnect delays shared by both ends of the device protocol (DESIGN.md §5).

endpointd redials the gateway with these delays, and the gateway's tests (or any other
client of the protocol) can reuse the same policy, so "1 s ×1.6 ±20 % up to 120 s" is
written down exactly once. Only the standard library is used: this module ships in the
daemon wheel.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


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
        # min() before the power would overflow only after ~1500 attempts; clamp anyway.
        exponent = min(self._attempt, 200)
        return min(self.cap, self.initial * self.factor**exponent)

    def next_delay(self) -> float:
        base = self.peek()
        self._attempt += 1
        return base * random.uniform(1.0 - self.jitter, 1.0 + self.jitter)  # noqa: S311

    def reset(self) -> None:
        self._attempt = 0
