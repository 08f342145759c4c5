"""The Feishu/Lark channel: messages to the bot become Triggers; replies go back in thread.

* :mod:`.routes`: ``POST /webhooks/lark``, whose checks are :mod:`.callback`'s: signature,
  decryption, verification token, the URL check;
* :mod:`.receiver`: the same events over Lark's websocket (no public ingress);
* :mod:`.events`: a message event → an IncomingTrigger;
* :mod:`.client`: Lark's Open API (access token, replies, reactions, the bot's identity);
* :mod:`.adapter`: :class:`~.adapter.LarkAdapter`, where it comes together.

Only the long connection uses Lark's SDK (``lark_oapi``, the ``lark`` extra:
``pip install 'superagent-server[lark]'``); callbacks and the Open API need nothing beyond
the core install. The SDK takes seconds to import (it loads every API it has), so only
:mod:`.receiver` imports it, when the long connection starts.
"""

from __future__ import annotations

import logging

from controlplane.channels.base import ChannelAdapter
from controlplane.channels.context import ChannelContext
from controlplane.channels.lark.routes import router
from controlplane.errors import require_extra

__all__ = ["build_adapter", "router"]

log = logging.getLogger(__name__)


def build_adapter(ctx: ChannelContext) -> ChannelAdapter | None:
    """The adapter for these settings, or None when the channel is not configured."""
    settings = ctx.settings.lark
    if settings.app_id is None or settings.app_secret is None:
        return None
    if settings.long_connection:
        require_extra(
            "lark_oapi", "lark", "Lark's long connection (SUPERAGENT_LARK__LONG_CONNECTION)"
        )
    from controlplane.channels.lark.adapter import LarkAdapter

    if settings.verification_token is None and not settings.long_connection:
        log.warning(
            "lark: no way to receive events; set SUPERAGENT_LARK__VERIFICATION_TOKEN (HTTP "
            "callbacks) or SUPERAGENT_LARK__LONG_CONNECTION=true"
        )
    return LarkAdapter(settings, ctx.intake)
