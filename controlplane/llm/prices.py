"""What each model's tokens cost: a table of well-known models' published prices, which the
operator's ``SUPERAGENT_LLM__PRICES`` extends and overrides, looked up by the model each
call was made with.

Every call is priced by its own model: the router's, a worker's, the watchdog's (which runs
on the router's model) and the compaction summaries alike. A model the table does not know
costs nothing, said once in the log: right for a local model, and visible for a hosted one
someone forgot to price.

A name matches a key exactly; else without a provider's prefix (``openai/gpt-4o``); else the
longest key it extends by a dash (``gpt-4o-2024-08-06`` is ``gpt-4o``, ``gpt-4o-mini-…`` is
``gpt-4o-mini``). The defaults are the providers' list prices per million tokens when this
release was made; providers change them, so an operator who bills by them should set their
own.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from decimal import Decimal

from controlplane.settings import LlmPrices

log = logging.getLogger(__name__)


def _p(prompt: float, cached: float, output: float) -> LlmPrices:
    return LlmPrices(
        input_usd_per_mtok=prompt, cached_usd_per_mtok=cached, output_usd_per_mtok=output
    )


# US dollars per million tokens: prompt tokens not from cache, from cache, completion.
DEFAULTS: dict[str, LlmPrices] = {
    "gpt-4o": _p(2.50, 1.25, 10.00),
    "gpt-4o-mini": _p(0.15, 0.075, 0.60),
    "gpt-4.1": _p(2.00, 0.50, 8.00),
    "gpt-4.1-mini": _p(0.40, 0.10, 1.60),
    "gpt-4.1-nano": _p(0.10, 0.025, 0.40),
    "gpt-5": _p(1.25, 0.125, 10.00),
    "gpt-5-mini": _p(0.25, 0.025, 2.00),
    "gpt-5-nano": _p(0.05, 0.005, 0.40),
    "o3": _p(2.00, 0.50, 8.00),
    "o4-mini": _p(1.10, 0.275, 4.40),
    "claude-opus-4": _p(15.00, 1.50, 75.00),
    "claude-sonnet-4": _p(3.00, 0.30, 15.00),
    "claude-haiku-4-5": _p(1.00, 0.10, 5.00),
    "claude-3-5-haiku": _p(0.80, 0.08, 4.00),
    "deepseek-chat": _p(0.28, 0.028, 0.42),
    "deepseek-reasoner": _p(0.28, 0.028, 0.42),
}

_MILLION = Decimal(1_000_000)
# The precision of every cost column (NUMERIC(12, 6)): what is recorded is rounded to it.
PRECISION = Decimal("0.000001")


def lookup(table: Mapping[str, LlmPrices], model: str) -> LlmPrices | None:
    """``model``'s prices in ``table`` (see the module doc for how names match)."""
    for name in (model, model.rsplit("/", 1)[-1]):
        if name in table:
            return table[name]
        extended = [key for key in table if name.startswith(key + "-")]
        if extended:
            return table[max(extended, key=len)]
    return None


class PriceBook:
    """The defaults with the operator's prices over them; ``for_model`` never fails."""

    def __init__(self, overrides: Mapping[str, LlmPrices] | None = None) -> None:
        self.table = {**DEFAULTS, **(overrides or {})}
        self._unpriced: set[str] = set()

    def for_model(self, model: str) -> LlmPrices:
        found = lookup(self.table, model)
        if found is not None:
            return found
        if model not in self._unpriced:
            self._unpriced.add(model)
            log.warning(
                "no price known for the model %r: its calls are recorded at $0 "
                "(SUPERAGENT_LLM__PRICES prices it)",
                model,
            )
        return LlmPrices()

    def cost(self, model: str, prompt: int, cached: int, completion: int) -> Decimal:
        """What one call cost, in dollars: cached prompt tokens at the cached rate."""
        prices = self.for_model(model)
        return (
            Decimal(str(prices.input_usd_per_mtok)) * (prompt - cached)
            + Decimal(str(prices.cached_usd_per_mtok)) * cached
            + Decimal(str(prices.output_usd_per_mtok)) * completion
        ) / _MILLION
