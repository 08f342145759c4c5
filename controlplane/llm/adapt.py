"""What a model's server refuses of a request, learned from its answer and not asked again.

OpenAI-compatible servers differ in what they accept beyond the common core, and say so
with a 400 naming the parameter:

* **strict tool schemas.** Some servers and gateways refuse ``"strict": true`` in a
  function's spec ("Unrecognized request argument supplied: strict"). The schemas are sent
  without it from then on; nothing is lost but the server's own decoding, since every
  call's arguments are checked against the same schema here
  (:mod:`controlplane.tools.schema`).
* **the output cap's name.** OpenAI's reasoning models refuse ``max_tokens`` and want
  ``max_completion_tokens``; older servers know only ``max_tokens``. The cap is sent under
  the name the server asks for.

Learned per model name, in this process (a replica learns it on its first refused call; the
refusal is an ``llm_calls`` row like any other). A refusal that names neither is the
caller's, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controlplane.llm.errors import LlmError, Permanent

__all__ = ["Adaptations"]

log = logging.getLogger(__name__)


@dataclass
class Adaptations:
    """The refusals learned so far, by model."""

    loose_schemas: set[str] = field(default_factory=set)
    completion_tokens_name: set[str] = field(default_factory=set)

    def request(
        self, model: str, tools: Sequence[Any] | None, max_tokens: int | None
    ) -> dict[str, Any]:
        """The optional parts of a request to ``model``, as its server takes them."""
        extra: dict[str, Any] = {}
        if tools:
            loose = model in self.loose_schemas
            extra["tools"] = [_without_strict(t) for t in tools] if loose else list(tools)
        if max_tokens is not None:
            name = "max_completion_tokens" if model in self.completion_tokens_name else "max_tokens"
            extra[name] = max_tokens
        return extra

    def learn(self, model: str, error: LlmError, extra: Mapping[str, Any]) -> bool:
        """Whether ``error`` is a refusal of something this request can do without (then
        the next request to ``model`` leaves it out, and the call is worth making again)."""
        if not isinstance(error, Permanent) or error.status != 400:
            return False
        text = str(error).lower()
        if "strict" in text and model not in self.loose_schemas and _any_strict(extra):
            self.loose_schemas.add(model)
            log.warning(
                "llm: %s refuses strict tool schemas; they are sent without `strict` from now"
                " on (every call's arguments are still checked against them here)",
                model,
            )
            return True
        if (
            "max_tokens" in text
            and "max_completion_tokens" in text
            and "max_tokens" in extra
            and model not in self.completion_tokens_name
        ):
            self.completion_tokens_name.add(model)
            log.warning("llm: %s wants its output cap as max_completion_tokens", model)
            return True
        return False


def _without_strict(tool: Any) -> Any:
    function = tool.get("function") if isinstance(tool, Mapping) else None
    if not isinstance(function, Mapping) or "strict" not in function:
        return tool
    return {**tool, "function": {k: v for k, v in function.items() if k != "strict"}}


def _any_strict(extra: Mapping[str, Any]) -> bool:
    for tool in extra.get("tools") or ():
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(function, Mapping) and function.get("strict"):
            return True
    return False
