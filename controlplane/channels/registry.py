"""Every channel the control plane knows, built from settings."""

from __future__ import annotations

import logging
from collections.abc import Callable

from fastapi import APIRouter

from controlplane.channels import github, lark, matrix, slack, webchat
from controlplane.channels.base import ChannelAdapter, Channels
from controlplane.channels.context import ChannelContext

log = logging.getLogger(__name__)

_FACTORIES: tuple[Callable[[ChannelContext], ChannelAdapter | None], ...] = (
    github.build_adapter,
    slack.build_adapter,
    matrix.build_adapter,
    lark.build_adapter,
    webchat.build_adapter,
)

# Mounted whether or not the channel is configured: an unconfigured channel's endpoint
# answers 404 with the setting to set, rather than not existing.
ROUTES: tuple[APIRouter, ...] = (
    github.router,
    slack.router,
    lark.router,
    webchat.router,
)


def build(ctx: ChannelContext) -> Channels:
    channels = Channels()
    for factory in _FACTORIES:
        adapter = factory(ctx)
        if adapter is not None:
            channels.add(adapter)
    log.info("channels: %s", ", ".join(channels.sources()) or "none configured")
    return channels
