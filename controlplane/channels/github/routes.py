"""``POST /webhooks/github``: verify, map to Triggers, ingest, answer. Never a 500 for bad input.

GitHub gives a delivery 10 seconds. The only work before the answer is the ingest (one short
statement per trigger), bounded a little under that: when the database is too slow, the
answer is a 503 saying so, and the delivery can be redelivered from GitHub (redeliveries
dedupe). Everything else (routing, replies, the 👀) happens after the answer, in the router
and the outbox.
"""

from __future__ import annotations

import asyncio
import logging

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from controlplane.channels.base import Ignored
from controlplane.channels.github import events
from controlplane.channels.webhook_body import parse_json, read_body, recorded
from controlplane.errors import (
    InvalidInput,
    NotFound,
    TransientError,
    Unauthorized,
)
from controlplane.web.state import app_state

log = logging.getLogger(__name__)

INGEST_BUDGET = 8.0  # seconds; GitHub gives up on a delivery after 10

router = APIRouter()


@router.post(
    "/webhooks/github",
    summary="GitHub webhook deliveries (signed with the webhook secret)",
    status_code=202,
)
async def receive_github(request: Request) -> JSONResponse:
    state = await app_state(request)
    settings = state.settings.github
    secret, intake = settings.webhook_secret, state.intake
    if secret is None or intake is None:
        raise NotFound("GitHub webhooks are not configured: set SUPERAGENT_GITHUB__WEBHOOK_SECRET")
    # Capped before the app too (api/body_limit.py); read here within the same setting.
    limit = state.settings.http.github_webhook_max_body_bytes
    body = await read_body(request, limit, "the limit for webhook payloads")
    signature = request.headers.get("x-hub-signature-256")
    if not events.signature_valid(secret.get_secret_value().encode(), body, signature):
        raise Unauthorized("X-Hub-Signature-256 does not match this body and the webhook secret")
    event = request.headers.get("x-github-event")
    delivery = request.headers.get("x-github-delivery")
    if not event or not delivery:
        raise InvalidInput("X-GitHub-Event and X-GitHub-Delivery are required")
    payload = parse_json(body)
    try:
        made = events.to_triggers(event, delivery, payload, body, agent_login=settings.agent_login)
    except (KeyError, TypeError, AttributeError) as exc:
        raise InvalidInput(f"malformed {event} payload (missing or wrong {exc})") from None
    if isinstance(made, Ignored):
        log.info("github delivery %s ignored: %s", delivery, made.reason)
        return JSONResponse({"ignored": made.reason}, status_code=200)
    try:
        async with asyncio.timeout(INGEST_BUDGET):
            results = [await intake.ingest(trigger) for trigger in made]
    except TimeoutError:
        raise TransientError(
            f"recording delivery {delivery} took over {INGEST_BUDGET:.0f}s (the database is "
            "slow or unreachable); redeliver it from the webhook's Recent Deliveries page"
        ) from None
    return JSONResponse(
        {"triggers": [recorded(r) for r in results]},
        status_code=202,
    )
