"""The web chat: a chat page in the console (/chat), its websocket, and ``superagent say``.

It is the embedded default IM of ``superagent up``: a full channel (source ``web``) whose
messages become Triggers like any other, and whose replies come back through the outbox.
"""

from __future__ import annotations

from controlplane.channels.base import ChannelAdapter
from controlplane.channels.context import ChannelContext
from controlplane.channels.webchat.adapter import WebChatAdapter
from controlplane.channels.webchat.routes import router

__all__ = ["WebChatAdapter", "build_adapter", "router"]


def build_adapter(ctx: ChannelContext) -> ChannelAdapter | None:
    """The adapter for these settings, or None when the chat is turned off."""
    return WebChatAdapter(ctx) if ctx.settings.webchat.enabled else None
