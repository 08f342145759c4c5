"""A prompt's size in tokens, estimated without a tokenizer, for every session's budget.

The estimate is the length of the JSON a call sends (its tool specs, then one message per
line, compact, non-ASCII as is) over :data:`CHARS_PER_TOKEN`. Four characters a token is
what providers' tokenizers give for English prose; code, IDs and JSON punctuation come out
a little denser, so the estimate errs on the small side there. Callers that see a
provider's own count (``usage.prompt_tokens``) scale by it (the worker's compaction does);
either way a session is compacted well before its window (``llm.compact_share``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

CHARS_PER_TOKEN = 4


def json_chars(value: Any) -> int:
    """The length of ``value`` as compact JSON, what the estimate counts."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str))


def prompt_chars(messages: Sequence[Mapping[str, Any]], tools: Sequence[Any]) -> int:
    """The length of a call's prompt: its tool specs, then one line of JSON per message."""
    return json_chars(list(tools)) + sum(json_chars(dict(m)) + 1 for m in messages)


def estimate_tokens(messages: Sequence[Mapping[str, Any]], tools: Sequence[Any]) -> int:
    """A call's prompt tokens, estimated (see the module docstring)."""
    return math.ceil(prompt_chars(messages, tools) / CHARS_PER_TOKEN)
