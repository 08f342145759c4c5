"""What an effect handler sees and may say back."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ClaimedEffect:
    id: str
    kind: str
    key: str
    payload: dict[str, Any]
    generation: int
    attempt: int  # 1 on the first try of this payload: the failure budget, which starts over
    claims: int = 1  # every claim of the row, never reset

    @property
    def first_try(self) -> bool:
        """No runner claimed this effect before, so it cannot have run already. After a
        runner died mid-handler this is False even when ``attempt`` started over (a new
        payload for the same key, a revived effect)."""
        return self.claims <= 1 and self.attempt <= 1


class Postpone(Exception):
    """Raised by a handler that cannot run *yet* (no free slot, device asleep).

    The effect is retried after ``seconds`` without counting as a failed attempt.
    """

    def __init__(self, seconds: float, reason: str = "") -> None:
        super().__init__(reason or f"postponed {seconds}s")
        self.seconds = seconds
        self.reason = reason


class Permanent(Exception):
    """Raised by a handler whose effect can never succeed as it stands (bad credentials,
    a deleted target): it is parked as dead at once, with this message, instead of retried.
    """

    failure_class = "permanent"  # as controlplane.failures counts it


Handler = Callable[[ClaimedEffect], Awaitable[None]]


class Handlers:
    """The registry of effect kinds a runner knows how to execute."""

    def __init__(self) -> None:
        self._by_kind: dict[str, Handler] = {}

    def register(self, kind: str, handler: Handler) -> None:
        if kind in self._by_kind:
            raise ValueError(f"effect kind {kind!r} already has a handler")
        self._by_kind[kind] = handler

    def get(self, kind: str) -> Handler | None:
        return self._by_kind.get(kind)

    def kinds(self) -> list[str]:
        return sorted(self._by_kind)
