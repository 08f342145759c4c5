"""The console. For now a single static page; it says plainly when no model is configured."""

from __future__ import annotations

from html import escape
from urllib.parse import urlsplit

from controlplane import __version__
from controlplane.settings import Settings

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Super-agent</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body{{font:16px/1.5 system-ui,sans-serif;max-width:42rem;margin:3rem auto;padding:0 1rem}}
.note{{padding:.75rem 1rem;border-radius:.5rem;background:#fff4d6}}</style></head>
<body><h1>Super-agent</h1>
<p>The control plane is running (version {version}).</p>
<p class="note">{model}</p>
<p>Health: <a href="/healthz">/healthz</a> · readiness: <a href="/readyz">/readyz</a> ·
API: <a href="/docs">/docs</a></p>
</body></html>
"""


def placeholder_page(settings: Settings) -> str:
    if settings.model_configured:
        # Only the host: a URL may carry credentials in its user-info part.
        host = urlsplit(settings.openai_base_url or "https://api.openai.com").hostname
        model = f"Model endpoint: {escape(host or 'unknown')}."
    else:
        model = (
            "No model is set: the agent runs in rules-only mode. Set OPENAI_BASE_URL and "
            "OPENAI_API_KEY to enable the router and workers."
        )
    return _PAGE.format(version=escape(__version__), model=model)
