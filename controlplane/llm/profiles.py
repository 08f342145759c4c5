"""A model's context window: from the settings, the server, or what is known of the model.

The router and the workers compact their sessions before a prompt would fill a share of the
window (``llm.compact_share``). A window set too large is worse than one too small: a local
server started with ``--ctx-size 8192`` answered prompts past it with a 400 (or cut them
silently), while the settings still said 128,000. So the window a role works with is, in
order:

1. ``llm.router_context_tokens`` / ``llm.worker_context_tokens`` when the operator set it;
2. what the server says it serves: llama.cpp's ``/props`` (``n_ctx``, the size it was
   started with), vLLM's ``/v1/models`` (``max_model_len``);
3. what is known of the model's name (:data:`KNOWN`, the providers' published windows);
4. the setting's default.

Asked once per model and process (:class:`Windows`); a server that does not answer in a
few seconds, or answers something else, is simply not a source. What a server refuses of a
request (strict schemas, the output cap's name) is learned from its answers instead
(:mod:`controlplane.llm.adapt`).
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import openai

__all__ = ["KNOWN", "Windows", "known_window"]

log = logging.getLogger(__name__)

# Published context windows by model-name prefix (longest prefix wins), in tokens.
KNOWN: dict[str, int] = {
    "gpt-4o": 128_000,
    "gpt-4.1": 1_047_576,
    "gpt-5": 400_000,
    "o1": 200_000,
    "o3": 200_000,
    "o4-mini": 200_000,
    "gpt-4-turbo": 128_000,
    "gpt-3.5-turbo": 16_385,
    "deepseek-chat": 64_000,
    "deepseek-reasoner": 64_000,
    "claude-": 200_000,
    "qwen2.5-coder": 32_768,
    "qwen2.5": 32_768,
    "llama-3.1": 128_000,
    "llama3.1": 128_000,
}
_DISCOVERY_SECONDS = 5.0


def known_window(model: str) -> int | None:
    """The published window of ``model`` by its name, or None."""
    name = model.lower().rsplit("/", 1)[-1]
    matches = [prefix for prefix in KNOWN if name.startswith(prefix)]
    return KNOWN[max(matches, key=len)] if matches else None


class Windows:
    """The window of each model, discovered once."""

    def __init__(self, client: openai.AsyncOpenAI) -> None:
        self.client = client
        self._found: dict[str, int | None] = {}

    async def window(self, model: str, configured: int | None, default: int) -> int:
        """The window to work with (see the module doc); ``configured``: the operator's
        setting, None when not set."""
        if configured is not None:
            return configured
        if model not in self._found:
            served = await self._served(model)
            self._found[model] = served or known_window(model)
            log.info(
                "llm: %s's context window is %s (%s)",
                model,
                self._found[model] or default,
                "served" if served else ("known" if self._found[model] else "default"),
            )
        return self._found[model] or default

    async def _served(self, model: str) -> int | None:
        base = str(self.client.base_url).rstrip("/")
        parts = urlsplit(base)
        root = urlunsplit((parts.scheme, parts.netloc, "", "", ""))
        headers = {"Authorization": f"Bearer {self.client.api_key}"}
        try:
            async with httpx.AsyncClient(timeout=_DISCOVERY_SECONDS, headers=headers) as http:
                for url, read in ((f"{root}/props", _llama_cpp), (f"{base}/models", _vllm)):
                    try:
                        answer = await http.get(url)
                    except httpx.HTTPError:
                        continue
                    if answer.status_code != 200:
                        continue
                    try:
                        found = read(answer.json(), model)
                    except ValueError:
                        continue
                    if found:
                        return found
        except httpx.HTTPError:
            return None
        return None


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _llama_cpp(props: Any, model: str) -> int | None:
    """llama.cpp's ``/props``: ``n_ctx`` of its default generation settings (per slot)."""
    if not isinstance(props, dict):
        return None
    settings = props.get("default_generation_settings")
    if isinstance(settings, dict):
        return _positive(settings.get("n_ctx"))
    return _positive(props.get("n_ctx"))


def _vllm(models: Any, model: str) -> int | None:
    """vLLM's ``/v1/models``: the entry of ``model``, its ``max_model_len``."""
    data = models.get("data") if isinstance(models, dict) else None
    for entry in data if isinstance(data, list) else ():
        if isinstance(entry, dict) and entry.get("id") == model:
            return _positive(entry.get("max_model_len"))
    return None
