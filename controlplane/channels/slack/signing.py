"""Slack's request signatures (v0): what the Events API sends in ``X-Slack-Signature``.

The signed base string is ``v0:{X-Slack-Request-Timestamp}:{raw body}``; the signature is
``v0=`` + hex HMAC-SHA256 of it with the app's signing secret. A request older (or newer)
than five minutes is refused even when correctly signed, so a captured request cannot be
replayed later.

The check is Slack's SDK's (``slack_sdk.signature.SignatureVerifier``, which has no
dependencies); this module adds the reason a request is refused, for the 401, and refuses
a body that is not UTF-8 before the SDK sees it (its verifier decodes the body and would
raise). :func:`sign` computes a signature from the definition, for tests and benchmarks.
"""

from __future__ import annotations

import hashlib
import hmac
import time

from slack_sdk.signature import Clock, SignatureVerifier

MAX_AGE_SECONDS = 300  # SignatureVerifier's own window, checked here too to say why


class _At(Clock):
    def __init__(self, now: float) -> None:
        self._now = now

    def now(self) -> float:
        return self._now


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    """What Slack puts in ``X-Slack-Signature``, for tests and benchmarks: computed here from
    the definition, independently of the SDK that checks it, and for any bytes (the SDK's
    verifier takes text only)."""
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
    now = time.time() if now is None else now
    if abs(now - sent_at) > MAX_AGE_SECONDS:
        return (
            "X-Slack-Request-Timestamp is more than 5 minutes from now (a replay, or this "
            "host's clock is off)"
        )
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:  # the SDK's verifier would raise on it
        return "the body is not UTF-8 text, which no request from Slack is"
    verifier = SignatureVerifier(secret.decode(), clock=_At(now))
    # hmac.compare_digest refuses non-ASCII str (TypeError): such a header is no signature.
    if not signature.isascii() or not verifier.is_valid(body, timestamp, signature):
        return "X-Slack-Signature does not match this body and the signing secret"
    return None
