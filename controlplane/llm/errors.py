"""What can go wrong with one model call, in the four classes callers act on.

::

    SuperagentError                      (controlplane.errors)
     └── LlmError                        outcome: one of the classes below
          ├── Transient                  429, 5xx, timeouts, connection errors, a 200 that is
          │                              not JSON; retried inside the module, then raised
          ├── ContextExceeded            the prompt does not fit the model's window
          ├── Permanent                  400, 401, 403, 404 (model not found), other 4xx
          └── Malformed                  a 200 without choices, a null message, a cut-off
                                         answer whose tool calls are not JSON

Every error carries ``outcome`` (the word recorded in ``llm_calls.outcome``), the HTTP
``status`` when there was one, and ``llm_call_id`` (the row that records it).
"""

from __future__ import annotations

from typing import Literal

from controlplane.errors import SuperagentError

__all__ = [
    "ContextExceeded",
    "LlmError",
    "Malformed",
    "Outcome",
    "Permanent",
    "Transient",
]

Outcome = Literal["ok", "transient", "context", "permanent", "malformed"]


class LlmError(SuperagentError):
    """A model call that produced no usable answer."""

    outcome: Outcome = "permanent"
    code = "llm"

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.llm_call_id: str | None = None

    def __str__(self) -> str:
        return f"{self.outcome}: {self.message}"

    @property
    def failure_class(self) -> str | None:
        """How ``controlplane.failures`` counts it: the outcome, unless that is "ok"."""
        return None if self.outcome == "ok" else self.outcome


class Transient(LlmError):
    """May succeed later: the provider is overloaded, down, slow, or behind a broken proxy."""

    outcome: Outcome = "transient"
    http_status = 503
    code = "llm_unavailable"

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
        retry: bool = True,
    ) -> None:
        super().__init__(message, status=status)
        self.retry_after = retry_after
        self.retry = retry  # False: the provider asked not to be retried now


class ContextExceeded(LlmError):
    """The conversation is longer than the model's window: compact it, then retry."""

    outcome: Outcome = "context"
    code = "llm_context"


class Permanent(LlmError):
    """The same request will fail again: a bad key, an unknown model, a rejected request."""

    outcome: Outcome = "permanent"
    code = "llm_permanent"


class Malformed(LlmError):
    """A 200 whose body has no usable answer in it."""

    outcome: Outcome = "malformed"
    code = "llm_malformed"
