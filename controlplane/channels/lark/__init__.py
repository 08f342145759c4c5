"""The Feishu/Lark channel: messages to the bot become Triggers; replies go back in thread.

* :mod:`.callback`: the HTTP event callback (``POST /webhooks/lark``): signature,
  decryption, verification token, the URL check;
* :mod:`.long_connection`: the same events over Lark's websocket (no public ingress);
* :mod:`.events`: a message event → an IncomingTrigger;
* :mod:`.api`: Lark's Open API (access token, replies, reactions, the bot's identity);
* :mod:`.channel`: :class:`~.channel.LarkAdapter`, where it comes together (the module is
  not named ``adapter``: that name is the factory below).

``lark_oapi`` takes seconds to import (it loads every API it has), so this module imports
none of it: the rest of the package is loaded only when Lark is configured.
"""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from controlplane.channels.base import ChannelAdapter
from controlplane.channels.context import ChannelContext
from controlplane.errors import NotFound
from controlplane.web.state import AppState, app_state

log = logging.getLogger(__name__)

SOURCE = "lark"
NOT_CONFIGURED = (
    "Feishu/Lark is not configured: set SUPERAGENT_LARK__APP_ID and "
    "SUPERAGENT_LARK__APP_SECRET, and SUPERAGENT_LARK__VERIFICATION_TOKEN for event callbacks"
)

routes = APIRouter()  # HTTP endpoints of this channel, mounted by the app


@routes.post(
    "/webhooks/lark",
    summary="Feishu/Lark event callbacks (token-checked; signed and encrypted with an encrypt key)",
)
async def lark_events(
    request: Request, state: Annotated[AppState, Depends(app_state)]
) -> JSONResponse:
    channel = state.channels.get(SOURCE)
    if channel is None:
        raise NotFound(NOT_CONFIGURED)
    from controlplane.channels.lark import callback
    from controlplane.channels.lark.channel import LarkAdapter

    assert isinstance(channel, LarkAdapter)
    return await callback.receive(request, channel)


def adapter(ctx: ChannelContext) -> ChannelAdapter | None:
    """The adapter for these settings, or None when the channel is not configured."""
    settings = ctx.settings.lark
    if settings.app_id is None or settings.app_secret is None:
        return None
    from controlplane.channels.lark.channel import LarkAdapter

    if settings.verification_token is None and not settings.long_connection:
        log.warning(
            "lark: no way to receive events; set SUPERAGENT_LARK__VERIFICATION_TOKEN (HTTP "
            "callbacks) or SUPERAGENT_LARK__LONG_CONNECTION=true"
        )
    return LarkAdapter(settings, ctx.intake)
