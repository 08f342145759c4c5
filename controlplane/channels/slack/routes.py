"""The Events API endpoint, POST /webhooks/slack: verify, answer Slack, ingest.

Checked in this order, none of the failures storing anything: body size (413, before the
app runs: api/body_limit.py), Slack configured (else 404 naming the setting), the v0
signature and its 5-minute window on the raw body (401), JSON (400). Then
``url_verification`` is answered with its challenge, and an ``event_callback`` goes to
:meth:`SlackAdapter.receive`. Slack wants an answer within three seconds; a delivery it
marks as a retry (``X-Slack-Retry-Num``) of an event already recorded is answered from the
record, without calling Slack or judging it again.
"""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from controlplane.channels.base import Ignored
from controlplane.channels.slack import signing
from controlplane.channels.slack.adapter import SOURCE, SlackAdapter
from controlplane.channels.webhook_body import json_object, read_body, recorded
from controlplane.errors import InvalidInput, NotFound, Unauthorized
from controlplane.web.state import AppState, app_state

log = logging.getLogger(__name__)

router = APIRouter()


@router.post(
    "/webhooks/slack",
    summary="Slack Events API requests (signed with the app's signing secret)",
)
async def slack_events(
    request: Request, state: Annotated[AppState, Depends(app_state)]
) -> JSONResponse:
    secret = state.settings.slack.signing_secret
    if secret is None:
        raise NotFound(
            "the Slack Events API is not configured: set SUPERAGENT_SLACK__SIGNING_SECRET "
            "(and SUPERAGENT_SLACK__BOT_TOKEN)"
        )
    adapter = state.channels.get(SOURCE)
    if not isinstance(adapter, SlackAdapter):
        raise NotFound("Slack is not configured: set SUPERAGENT_SLACK__BOT_TOKEN")
    body = await read_body(request, state.settings.http.slack_webhook_max_body_bytes)
    problem = signing.problem(
        secret.get_secret_value().encode(),
        body,
        request.headers.get("x-slack-request-timestamp"),
        request.headers.get("x-slack-signature"),
    )
    if problem is not None:
        raise Unauthorized(problem)
    callback = json_object(body)
    kind = callback.get("type")
    if kind == "url_verification":
        challenge = callback.get("challenge")
        if not isinstance(challenge, str):
            raise InvalidInput("url_verification carries no challenge")
        return JSONResponse({"challenge": challenge})
    if kind == "app_rate_limited":
        log.warning(
            "Slack is dropping this app's events (over 30,000 an hour in team %s)",
            callback.get("team_id"),
        )
        return JSONResponse({"ignored": "app_rate_limited noted"})
    if kind != "event_callback":
        return JSONResponse({"ignored": f"{kind} is not a request type the agent handles"})
    retried = request.headers.get("x-slack-retry-num") is not None
    result = await adapter.receive(callback, retried=retried)
    if isinstance(result, Ignored):
        log.info("slack event %s ignored: %s", callback.get("event_id"), result.reason)
        return JSONResponse({"ignored": result.reason})
    return JSONResponse({"trigger": recorded(result)})
