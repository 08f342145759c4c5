"""Inbound webhooks: verify, turn into Triggers, ingest, answer. Never a 500 for bad input."""

from __future__ import annotations

import json
import logging

from fastapi import Request
from fastapi.responses import JSONResponse

from controlplane.channels.github import webhooks as github
from controlplane.errors import InvalidInput, NotFound, Unauthorized
from controlplane.ingest.intake import Intake
from controlplane.settings import Settings

log = logging.getLogger(__name__)


async def receive_github(
    request: Request, settings: Settings, intake: Intake | None
) -> JSONResponse:
    secret = settings.github.webhook_secret
    if secret is None or intake is None:
        raise NotFound("GitHub webhooks are not configured: set SUPERAGENT_GITHUB__WEBHOOK_SECRET")
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > github.MAX_BODY:
        raise InvalidInput(f"the body is over {github.MAX_BODY >> 20} MB")
    body = await request.body()
    signature = request.headers.get("x-hub-signature-256")
    if not github.signature_valid(secret.get_secret_value().encode(), body, signature):
        raise Unauthorized("X-Hub-Signature-256 does not match this body and the webhook secret")
    event = request.headers.get("x-github-event")
    delivery = request.headers.get("x-github-delivery")
    if not event or not delivery:
        raise InvalidInput("X-GitHub-Event and X-GitHub-Delivery are required")
    try:
        payload = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"the body is not JSON ({exc})") from None
    try:
        made = github.to_triggers(
            event, delivery, payload, body, agent_login=settings.github.agent_login
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise InvalidInput(f"malformed {event} payload (missing or wrong {exc})") from None
    if isinstance(made, github.Ignored):
        log.info("github delivery %s ignored: %s", delivery, made.reason)
        return JSONResponse({"ignored": made.reason}, status_code=200)
    results = [await intake.ingest(trigger) for trigger in made]
    return JSONResponse(
        {
            "triggers": [
                {
                    "id": r.trigger_id,
                    "thread": r.thread_id,
                    "verdict": r.verdict,
                    "route": r.route,
                    "duplicate": r.duplicate,
                }
                for r in results
            ]
        },
        status_code=202,
    )
