"""Lark's HTTP event callback: verify, decrypt, check the token, then hand the event on.

The checks run in this order, each before anything is parsed further:

1. size: a body over ``SUPERAGENT_HTTP__LARK_WEBHOOK_MAX_BODY_BYTES`` is refused (413)
   before it is read whole (by api/body_limit.py, before this module runs);
2. signature, when an encrypt key is set: ``X-Lark-Signature`` is the SHA-256 (hex) of
   ``X-Lark-Request-Timestamp + X-Lark-Request-Nonce + encrypt key + raw body``, compared
   in constant time (401 on a mismatch); then the signed timestamp must be within
   ``MAX_AGE_SECONDS`` of now (401 otherwise), so a captured callback cannot be replayed
   later (Lark signs each delivery, redeliveries included, anew);
3. decryption of ``{"encrypt": ...}`` (AES-256-CBC, key SHA-256 of the encrypt key, the IV
   leading the ciphertext; 400 if it cannot be decrypted);
4. the verification token in the event (``header.token``; ``token`` for the URL check), in
   constant time (401);
5. the URL check (``url_verification``) is answered with its challenge;
6. anything else must be a schema 2.0 event; a message event becomes a Trigger.

One exception to 2: Lark sends the URL check without signature headers (it is not signed,
only encrypted). An unsigned request is therefore let through to step 5 *only* if it
decrypts with the encrypt key, carries the right token and is the URL check; every event
that could become a Trigger must be signed.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cryptography.hazmat.primitives import padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from fastapi import Request
from fastapi.responses import JSONResponse

from controlplane.channels.base import Ignored
from controlplane.channels.webhook_body import json_object, read_body, recorded
from controlplane.errors import InvalidInput, NotFound, Unauthorized
from controlplane.web.state import app_state

if TYPE_CHECKING:
    from controlplane.channels.lark.adapter import LarkAdapter

log = logging.getLogger(__name__)

SIGNATURE = "x-lark-signature"
TIMESTAMP = "x-lark-request-timestamp"
NONCE = "x-lark-request-nonce"
URL_VERIFICATION = "url_verification"
MAX_AGE_SECONDS = 300  # as Slack's: a signed callback older or newer than this is refused


@dataclass(frozen=True)
class Opened:
    """A verified callback body: the URL check's challenge, or an event (schema 2.0)."""

    challenge: str | None = None
    event: dict[str, Any] | None = None


def signature(timestamp: str, nonce: str, encrypt_key: str, body: bytes) -> str:
    """What Lark puts in ``X-Lark-Signature`` for ``body``."""
    return hashlib.sha256((timestamp + nonce + encrypt_key).encode() + body).hexdigest()


def open_callback(
    body: bytes,
    headers: Mapping[str, str],
    *,
    verification_token: str,
    encrypt_key: str | None,
) -> Opened:
    """Verify and decrypt one callback body (see the module docstring for the order)."""
    signed = False
    if encrypt_key:
        given = headers.get(SIGNATURE)
        if given is not None:
            expected = signature(
                headers.get(TIMESTAMP, ""), headers.get(NONCE, ""), encrypt_key, body
            )
            if not hmac.compare_digest(expected.encode(), given.encode()):
                raise Unauthorized("X-Lark-Signature does not match this body and the encrypt key")
            _check_fresh(headers.get(TIMESTAMP))
            signed = True
    outer = json_object(body, "the body")
    encrypted = "encrypt" in outer
    if encrypted:
        if not encrypt_key:
            raise InvalidInput(
                "the event is encrypted but no encrypt key is set: set "
                "SUPERAGENT_LARK__ENCRYPT_KEY to the event subscription's Encrypt Key"
            )
        payload = json_object(_decrypt(outer["encrypt"], encrypt_key), "the decrypted event")
    else:
        payload = outer
    header = payload.get("header")
    token = header.get("token") if isinstance(header, dict) else payload.get("token")
    if not isinstance(token, str) or not hmac.compare_digest(
        token.encode(), verification_token.encode()
    ):
        raise Unauthorized("the event's token is not the verification token")
    if payload.get("type") == URL_VERIFICATION:
        if encrypt_key and not (signed or encrypted):
            raise Unauthorized("with an encrypt key set, a plain URL check must be signed")
        return Opened(challenge=str(payload.get("challenge", "")))
    if encrypt_key and not signed:
        raise Unauthorized(
            "X-Lark-Signature, X-Lark-Request-Timestamp and X-Lark-Request-Nonce are required "
            "when an encrypt key is set"
        )
    if payload.get("schema") != "2.0" or not isinstance(header, dict):
        raise InvalidInput("only schema 2.0 events are accepted (the event names no header)")
    return Opened(event=payload)


def _check_fresh(timestamp: str | None, now: float | None = None) -> None:
    """Unauthorized unless the signed ``X-Lark-Request-Timestamp`` is a Unix time within
    ``MAX_AGE_SECONDS`` of now."""
    try:
        sent_at = int(timestamp or "")
    except ValueError:
        raise Unauthorized("X-Lark-Request-Timestamp is not a Unix time") from None
    if abs((time.time() if now is None else now) - sent_at) > MAX_AGE_SECONDS:
        raise Unauthorized(
            "X-Lark-Request-Timestamp is more than 5 minutes from now (a replay, or this "
            "host's clock is off)"
        )


def decrypt(encrypt_key: str, data: bytes) -> bytes:
    """Lark's event encryption undone: AES-256-CBC, the key the SHA-256 of the encrypt key,
    the IV the first block, PKCS7 padding. ValueError if ``data`` is not such a ciphertext."""
    block = algorithms.AES.block_size // 8
    if len(data) < 2 * block or len(data) % block:
        raise ValueError("not an AES-CBC ciphertext with its IV")
    key = hashlib.sha256(encrypt_key.encode()).digest()
    decryptor = Cipher(algorithms.AES(key), modes.CBC(data[:block])).decryptor()
    padded = decryptor.update(data[block:]) + decryptor.finalize()
    unpadder = padding.PKCS7(algorithms.AES.block_size).unpadder()
    return unpadder.update(padded) + unpadder.finalize()  # ValueError on bad padding


def _decrypt(value: Any, encrypt_key: str) -> bytes:
    if not isinstance(value, str):
        raise InvalidInput("the encrypt field is not a string")
    try:
        return decrypt(encrypt_key, base64.b64decode(value, validate=True))
    except (ValueError, binascii.Error):
        raise InvalidInput(
            "the event cannot be decrypted with the encrypt key (is "
            "SUPERAGENT_LARK__ENCRYPT_KEY the subscription's current Encrypt Key?)"
        ) from None


async def receive(request: Request, adapter: LarkAdapter) -> JSONResponse:
    """POST /webhooks/lark: answer the URL check, or ingest the event."""
    settings = adapter.settings
    if settings.verification_token is None:
        raise NotFound(
            "Lark event callbacks are not configured: set SUPERAGENT_LARK__VERIFICATION_TOKEN "
            "(the event subscription's Verification Token)"
        )
    limit = (await app_state(request)).settings.http.lark_webhook_max_body_bytes
    body = await read_body(request, limit)
    opened = open_callback(
        body,
        request.headers,
        verification_token=settings.verification_token.get_secret_value(),
        encrypt_key=settings.encrypt_key.get_secret_value() if settings.encrypt_key else None,
    )
    if opened.challenge is not None:
        return JSONResponse({"challenge": opened.challenge})
    assert opened.event is not None
    result = await adapter.handle(opened.event)
    if isinstance(result, Ignored):
        log.info("lark event ignored: %s", result.reason)
        return JSONResponse({"ignored": result.reason})
    # Lark wants a 200 within 3 s; anything else counts as a failed delivery.
    return JSONResponse({"trigger": recorded(result)})
