"""The console. For now a single page: the model, who leads the router, and whether the
agent is paused."""

from __future__ import annotations

from html import escape
from urllib.parse import urlsplit

from controlplane import __version__
from controlplane.settings import Settings
from controlplane.status import Status, ago, leader_line

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Super-agent</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body{{font:16px/1.5 system-ui,sans-serif;max-width:42rem;margin:3rem auto;padding:0 1rem}}
.note{{padding:.75rem 1rem;border-radius:.5rem;background:#fff4d6}}</style></head>
<body><h1>Super-agent</h1>
<p>The control plane is running (version {version}).</p>
<p class="note">{model}</p>
{paused}<p>Router leader: {leader}</p>
<p>Waiting for the router: {inbox} event(s) · active tickets: {tickets} ·
devices online: {online} of {paired}</p>
{chat}<p>Health: <a href="/healthz">/healthz</a> · readiness: <a href="/readyz">/readyz</a> ·
API: <a href="/docs">/docs</a></p>
</body></html>
"""


def page(settings: Settings, status: Status | None, channels: list[str] | None = None) -> str:
    """The page; ``status`` is None when the database could not be read just now."""
    connected = ", ".join(channels or []) or "none"
    chat = f"<p>Channels: {escape(connected)}"
    if settings.webchat.enabled:
        chat += ' · talk to the agent in the <a href="/chat">web chat</a>'
    chat += "</p>\n"
    if settings.model_configured:
        # Only the host: a URL may carry credentials in its user-info part.
        host = urlsplit(settings.openai_base_url or "https://api.openai.com").hostname
        model = f"Model endpoint: {escape(host or 'unknown')}."
    else:
        model = (
            "No model is set: the agent runs in rules-only mode. Set OPENAI_BASE_URL and "
            "OPENAI_API_KEY to enable the router and workers."
        )
    if status is None:
        return _PAGE.format(
            version=escape(__version__),
            model=model,
            chat=chat,
            paused='<p class="note">The database is not answering; see /readyz.</p>\n',
            leader="unknown",
            inbox="?",
            tickets="?",
            online="?",
            paired="?",
        )
    paused = ""
    if status.paused_at is not None:
        why = f": {status.paused_reason}" if status.paused_reason else ""
        paused = (
            f'<p class="note">Paused {escape(ago(status.paused_at))} by '
            f"{escape(status.paused_by or '')}{escape(why)}. Events are recorded; "
            "<code>superagent resume</code> continues.</p>\n"
        )
    return _PAGE.format(
        version=escape(__version__),
        model=model,
        chat=chat,
        paused=paused,
        leader=escape(leader_line(status)),
        inbox=status.router_inbox,
        tickets=status.tickets_active,
        online=status.devices_online,
        paired=status.devices_paired,
    )
