"""Lark's HTTP event callback route (``POST /webhooks/lark``); the checks are
:mod:`.callback`'s. Mounted whether or not Lark is configured: unconfigured, it answers 404
with the settings to set."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from controlplane.errors import NotFound
from controlplane.web.state import AppState, app_state

NOT_CONFIGURED = (
    "Feishu/Lark is not configured: set SUPERAGENT_LARK__APP_ID and "
    "SUPERAGENT_LARK__APP_SECRET, and SUPERAGENT_LARK__VERIFICATION_TOKEN for event callbacks"
)

router = APIRouter()  # HTTP endpoints of this channel, mounted by the app


@router.post(
    "/webhooks/lark",
    summary="Feishu/Lark event callbacks (token-checked; signed and encrypted with an encrypt key)",
)
async def lark_events(
    request: Request, state: Annotated[AppState, Depends(app_state)]
) -> JSONResponse:
    channel = state.channels.get("lark")
    if channel is None:
        raise NotFound(NOT_CONFIGURED)
    # Imported here: lark_oapi takes seconds to import, and only a configured Lark needs it.
    from controlplane.channels.lark import callback
    from controlplane.channels.lark.adapter import LarkAdapter

    assert isinstance(channel, LarkAdapter)
    return await callback.receive(request, channel)
