"""What a GitHub answer means for the caller: fine, wait, fix something, or try again later.

* 401, and 403 that is not a rate limit (bad credentials, a missing permission), 404, 410
  and 422 are :class:`ChannelError`: retrying will not help, and the message says what to fix.
* 403 or 429 with rate-limit headers (or GitHub's secondary-limit message) are
  :class:`RateLimited` for as long as GitHub asks: ``Retry-After``, else until
  ``X-RateLimit-Reset``, else a minute (GitHub's advice for secondary limits).
* 5xx and network failures are :class:`TransientError` (retried with backoff).

Messages quote GitHub's own ``message`` and the request line; never a header, so never a
token.
"""

from __future__ import annotations

from typing import Any

import httpx

from controlplane.channels.base import ChannelError, RateLimited
from controlplane.errors import TransientError

SECONDARY_LIMIT_WAIT = 60.0  # GitHub: wait at least a minute when it gives no time


def github_message(response: httpx.Response) -> str:
    """GitHub's explanation from an error body (``message`` and validation ``errors``)."""
    try:
        body = response.json()
    except ValueError:
        return response.reason_phrase
    if not isinstance(body, dict):
        return response.reason_phrase
    text = str(body.get("message") or response.reason_phrase)
    details = [
        str(e.get("message") or e.get("code") or "") if isinstance(e, dict) else str(e)
        for e in body.get("errors") or []
    ]
    details = [d for d in details if d]
    if details:
        text += ": " + "; ".join(details)
    return text[:300]


def body_of(response: httpx.Response, what: str) -> Any:
    """The JSON of a successful answer. A body that is not JSON (a proxy's error page, a
    truncated answer) is a transient failure, not a crash."""
    try:
        return response.json()
    except ValueError:
        raise TransientError(f"GitHub's answer to {what} is not JSON; will retry") from None


def rate_limit_wait(response: httpx.Response, now: float) -> float | None:
    """Seconds GitHub asks us to wait, or None when this answer is not a rate limit."""
    if response.status_code not in (403, 429):
        return None
    retry_after = response.headers.get("retry-after")
    if retry_after is not None:
        try:
            return max(float(retry_after), 1.0)
        except ValueError:
            return SECONDARY_LIMIT_WAIT
    reset = response.headers.get("x-ratelimit-reset")
    if response.headers.get("x-ratelimit-remaining") == "0" and reset and reset.isdigit():
        return max(int(reset) - now, 1.0)
    if response.status_code == 429 or "rate limit" in github_message(response).lower():
        return SECONDARY_LIMIT_WAIT
    return None


def raise_for_status(response: httpx.Response, what: str, now: float) -> None:
    """Nothing for a success or a 304; otherwise the error that tells the caller what to do.

    ``what`` is the request line ("POST /repos/o/r/issues/7/comments"), for the message.
    """
    status = response.status_code
    if status < 400:
        return
    wait = rate_limit_wait(response, now)
    if wait is not None:
        raise RateLimited(wait, f"GitHub rate limit on {what}: retry in {wait:.0f}s")
    message = github_message(response)
    if status == 401:
        raise ChannelError(
            f"GitHub rejected the credentials on {what} ({message}): check "
            "SUPERAGENT_GITHUB__TOKEN, or the App's SUPERAGENT_GITHUB__APP_ID and private key"
        )
    if status == 403:
        raise ChannelError(
            f"GitHub refused {what} ({message}): the token or App lacks a permission; grant "
            "Issues and Pull requests read & write (and Metadata read)"
        )
    if status in (404, 410):
        raise ChannelError(
            f"GitHub answered {status} to {what} ({message}): it does not exist, or the "
            "credentials cannot see it (install the App on that repository, or give the token "
            "access to it)"
        )
    if status == 422:
        raise ChannelError(f"GitHub refused {what} as invalid ({message})")
    if status >= 500:
        raise TransientError(f"GitHub answered {status} to {what}; will retry")
    raise ChannelError(f"GitHub answered {status} to {what} ({message})")
