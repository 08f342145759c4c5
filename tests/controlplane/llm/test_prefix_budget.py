"""The fixed prefix every call carries (the system prompt and the tool specs) leaves most of
a small model's 8,192-token window to the conversation (issue 32, part 4).

Measured with the real model's tokenizer in bench/RESULTS.md (`bench.prefix
--real-model`): the real count runs 5 to 10 % above the product's estimate, so these
limits, on the estimate, hold the real prefix near a quarter of the window for the router
and two fifths for a worker. A tool or prompt that grows past them is a choice to make
with that number in view, not an accident.
"""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.llm.tokens import estimate_tokens
from controlplane.prompts import DEFAULTS
from controlplane.router.tools.toolbox import TOOL_SPECS as ROUTER_SPECS
from controlplane.workers.tools.toolbox import TOOL_SPECS as WORKER_SPECS

WINDOW = 8192


@pytest.mark.parametrize(
    ("role", "specs", "share"),
    [("router", ROUTER_SPECS, 0.25), ("worker", WORKER_SPECS, 0.38)],
)
def test_the_fixed_prefix_leaves_the_window_to_the_conversation(
    role: str, specs: list[Any], share: float
) -> None:
    prefix = estimate_tokens([{"role": "system", "content": DEFAULTS[role]}], specs)
    assert prefix <= share * WINDOW, (
        f"the {role}'s prompt and tools take {prefix} tokens, {prefix / WINDOW:.0%} of an "
        f"8k window (the limit is {share:.0%}): cut, or raise the limit knowingly"
    )
