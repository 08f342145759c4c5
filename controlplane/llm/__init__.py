"""The model boundary: every call to a model goes through :class:`LlmClient`."""

from controlplane.llm.client import Accounting, Answer, LlmClient, ToolCall, Usage
from controlplane.llm.errors import ContextExceeded, LlmError, Malformed, Permanent, Transient

__all__ = [
    "Accounting",
    "Answer",
    "ContextExceeded",
    "LlmClient",
    "LlmError",
    "Malformed",
    "Permanent",
    "ToolCall",
    "Transient",
    "Usage",
]
