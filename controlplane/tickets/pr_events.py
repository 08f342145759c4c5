"""GitHub's verdict on a pull request's event, as the GitHub adapter writes it in the text.

Two facts decide what a ticket does next: whether a CI result passed
(:mod:`controlplane.tickets.pr_rounds`) and whether a closed pull request was merged
(:func:`controlplane.tickets.store.end_closed_pull_requests`). The adapter
(:mod:`controlplane.channels.github.events`) writes GitHub's field *first* in the event's
text, in the fixed form below, before any words people chose (a check's name, a title):
so a check named ``"x: success"`` or a title ``"(merged)"`` cannot change what is read, and
the control plane reads it with a prefix match rather than by interpreting anyone's words.

This module imports nothing of the control plane's (the store reads it).
"""

from __future__ import annotations

import re

# A CI result: "CI <conclusion>: <check> (<url>)".
CI_PREFIX = "CI "
# Conclusions that need no fix from the worker: it passed, did not run, or waits for a
# person (a workflow run to approve, a check GitHub marked stale). Anything else (failure,
# timed_out, cancelled, startup_failure, or a text not in this form) is a failure.
NO_FIX = ("success", "neutral", "skipped", "action_required", "stale")

# A pull request closed: "pull_request.closed (merged): <title>", or "(not merged)".
MERGED = "pull_request.closed (merged): "
NOT_MERGED = "pull_request.closed (not merged): "

_URL_TAIL = re.compile(r"\s\(https?://[^\s)]*\)$")
CHECK_CHARS = 100


def ci_text(conclusion: str, check: str, url: str | None = None) -> str:
    text = f"{CI_PREFIX}{conclusion}: {check}"
    return f"{text} ({url})" if url else text


def ci_verdict(conclusion: str) -> str:
    """The text's first field (before the first ``:``) for ``conclusion``."""
    return f"{CI_PREFIX}{conclusion}"


def check_of(text: str) -> str:
    """The check a CI result's text names, to say to people (never to decide on)."""
    head, sep, rest = text.partition(": ")
    name = rest if sep and head.startswith(CI_PREFIX) else text
    return _URL_TAIL.sub("", name).strip()[:CHECK_CHARS] or "CI"


def closed_text(merged: bool, title: str) -> str:
    return f"{MERGED if merged else NOT_MERGED}{title}"
