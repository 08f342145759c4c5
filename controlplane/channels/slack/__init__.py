"""The Slack channel: app mentions and DMs in (Events API or Socket Mode), threaded replies
and 👀 out. Modules: :mod:`.events` (which events count), :mod:`.signing`, :mod:`.routes`
(POST /webhooks/slack), :mod:`.receiver`, :mod:`.client`, :mod:`.directory` (who wrote
it), :mod:`.adapter` (the adapter itself)."""

from __future__ import annotations

import logging

from controlplane.channels.base import ChannelAdapter
from controlplane.channels.context import ChannelContext
from controlplane.channels.slack.adapter import SOURCE, SlackAdapter
from controlplane.channels.slack.routes import router

__all__ = ["SOURCE", "SlackAdapter", "build_adapter", "router"]

log = logging.getLogger(__name__)


def build_adapter(ctx: ChannelContext) -> ChannelAdapter | None:
    """The adapter for these settings, or None when the channel is not configured."""
    settings = ctx.settings.slack
    if settings.bot_token is None:
        if settings.app_token is not None or settings.signing_secret is not None:
            log.warning("Slack is off: set SUPERAGENT_SLACK__BOT_TOKEN to turn it on")
        return None
    if settings.app_token is None and settings.signing_secret is None:
        log.warning(
            "Slack can reply but hears nothing: set SUPERAGENT_SLACK__APP_TOKEN (Socket "
            "Mode) or SUPERAGENT_SLACK__SIGNING_SECRET (Events API)"
        )
    return SlackAdapter(settings, ctx.intake)
