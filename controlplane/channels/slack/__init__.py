"""The slack channel (not built yet)."""

from __future__ import annotations

from fastapi import APIRouter

from controlplane.channels.base import ChannelAdapter
from controlplane.channels.context import ChannelContext

routes = APIRouter()  # HTTP endpoints of this channel, mounted by the app


def adapter(ctx: ChannelContext) -> ChannelAdapter | None:
    """The adapter for these settings, or None when the channel is not configured."""
    return None
