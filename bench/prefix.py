"""The fixed prefix every router and worker call carries (system prompt and tool specs), in
tokens: what is left of a small model's window for the conversation.

Counted two ways, side by side:

* the product's own estimate (``controlplane.llm.tokens``: compact JSON over 4 characters a
  token), which sizes every session's budget;
* with ``--real-model``, the real count: Qwen2.5-Coder-1.5B-Instruct's chat template
  applied by llama.cpp's ``llama-server`` (``/apply-template``, then ``/tokenize``), with
  the model and server from ``scripts/real_model``'s cache. The template adds its own
  tool-calling instructions; the count is what the server evaluates.

Each part is counted alone (the system prompt, then each tool) as the difference it makes
to the whole, so the biggest tools show where a cut would pay.

    .venv/bin/python -m bench.prefix                # the estimate only
    .venv/bin/python -m bench.prefix --real-model   # and the real tokenizer's count
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from controlplane.llm.tokens import estimate_tokens
from controlplane.prompts import DEFAULTS
from controlplane.router.tools.toolbox import TOOL_SPECS as ROUTER_TOOLS
from controlplane.workers.tools.toolbox import TOOL_SPECS as WORKER_TOOLS

WINDOW = 8192  # the small window the product must work in (issue 32, part 4)

Counter = Callable[[list[dict[str, Any]], Sequence[Any]], int]


def estimated(messages: list[dict[str, Any]], tools: Sequence[Any]) -> int:
    return estimate_tokens(messages, tools)


def real_counter(base: str) -> Counter:
    """Tokens of the prompt llama-server would evaluate for ``messages`` and ``tools``."""
    client = httpx.Client(base_url=base, timeout=60)

    def count(messages: list[dict[str, Any]], tools: Sequence[Any]) -> int:
        body: dict[str, Any] = {"messages": messages}
        if tools:
            body["tools"] = list(tools)
        prompt = client.post("/apply-template", json=body).raise_for_status().json()["prompt"]
        tokens = client.post("/tokenize", json={"content": prompt}).raise_for_status()
        return len(tokens.json()["tokens"])

    return count


@contextlib.contextmanager
def llama_server() -> Iterator[str]:
    from tests.support import real_model  # only with --real-model: a test-only module

    with tempfile.TemporaryDirectory() as tmp, real_model.running(Path(tmp) / "server.log") as s:
        yield s.url.removesuffix("/v1")


def table(role: str, tools: Sequence[Any], counters: dict[str, Counter]) -> list[str]:
    system = [{"role": "system", "content": DEFAULTS[role]}]
    names = list(counters)
    rows = [f"### {role}: {len(tools)} tools", "", "| part | " + " | ".join(names) + " |"]
    rows.append("|---|" + "---:|" * len(names))
    whole = {name: count(system, tools) for name, count in counters.items()}
    parts: list[tuple[str, dict[str, int]]] = [
        ("system prompt", {n: whole[n] - c([], tools) for n, c in counters.items()}),
    ]
    for spec in tools:
        rest = [t for t in tools if t is not spec]
        alone = {n: whole[n] - c(system, rest) for n, c in counters.items()}
        parts.append((f"tool `{spec['function']['name']}`", alone))
    parts.sort(key=lambda part: -part[1][names[-1]])
    for label, counts in parts:
        rows.append(f"| {label} | " + " | ".join(str(counts[n]) for n in names) + " |")
    rows.append("| **the whole prefix** | " + " | ".join(f"**{whole[n]}**" for n in names) + " |")
    rows.append(
        "| share of an 8,192-token window | "
        + " | ".join(f"{whole[n] / WINDOW:.0%}" for n in names)
        + " |"
    )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--real-model",
        action="store_true",
        help="also count with the real model's template and tokenizer (scripts/real_model)",
    )
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        counters: dict[str, Counter] = {"estimate (chars / 4)": estimated}
        if args.real_model:
            counters["Qwen2.5-Coder tokens"] = real_counter(stack.enter_context(llama_server()))
        lines: list[str] = []
        for role, tools in (("router", ROUTER_TOOLS), ("worker", WORKER_TOOLS)):
            lines += [*table(role, tools, counters), ""]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
