"""Slack's request signatures (v0): what the Events API sends in ``X-Slack-Signature``.

The signed base string is ``v0:{X-Slack-Request-Timestamp}:{raw body}``; the signature is
``v0=`` + hex HMAC-SHA256 of it with the app's signing secret. A request older (or newer)
than five minutes is refused even when correctly signed, so a captured request cannot be
replayed later.
"""

from __future__ import annotations

import hashlib
import hmac
import time

MAX_AGE_SECONDS = 300


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    """What Slack puts in ``X-Slack-Signature`` (also for tests and benchmarks)."""
    base = b"v0:" + timestamp.encode() + b":" + body
    return "v0=" + hmac.new(secret, base, hashlib.sha256).hexdigest()


def problem(
    secret: bytes,
    body: bytes,
    timestamp: str | None,
    signature: str | None,
    *,
    now: float | None = None,
) -> str | None:
    """Why the request is not verifiably from Slack, or None when it is."""
    if not timestamp or not signature:
        return "X-Slack-Request-Timestamp and X-Slack-Signature are required"
    try:
        sent_at = int(timestamp)
    except ValueError:
        return "X-Slack-Request-Timestamp is not a Unix time"
    if abs((time.time() if now is None else now) - sent_at) > MAX_AGE_SECONDS:
        return (
            "X-Slack-Request-Timestamp is more than 5 minutes from now (a replay, or this "
            "host's clock is off)"
        )
    expected = sign(secret, timestamp, body)
    if not hmac.compare_digest(expected.encode(), signature.encode()):
        return "X-Slack-Signature does not match this body and the signing secret"
    return None
