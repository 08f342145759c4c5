"""Prefixed short random identifiers: ``tkt_8f3k2q9m4xw7``.

The prefix tells a reader (and the router model) what kind of object an ID names; the
random part uses an alphabet without look-alike characters. Twelve characters give 60 bits,
so collisions stay negligible for the life of a deployment even on high-churn tables.
"""

from __future__ import annotations

import base64
import hashlib
import re
import secrets

ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, lower case: no i, l, o, u
RANDOM_LENGTH = 12

PREFIXES = frozenset(
    {
        "trg",
        "thr",
        "tkt",
        "mnd",
        "asg",
        "ses",
        "msg",
        "dev",
        "cmd",
        "eff",
        "blb",
        "prm",
        "pol",
        "llm",
        "pcd",
        "dec",
        "prs",
        "rpt",
        "wev",
        "wfd",
        "ifl",
        "wac",
        "apr",
        "hrn",  # a harness run (controlplane.workers.harness)
        "sup",  # a step of a harness round's, recorded as a tool call
        "tok",  # a named API token (controlplane.access.api_tokens)
    }
)

_ID_RE = re.compile(rf"^([a-z]{{3}})_[{ALPHABET}]{{{RANDOM_LENGTH}}}$")


# Base32 digits in RFC 4648 order mapped onto ALPHABET (both 32 symbols, so still uniform):
# random bytes become IDs in C, which matters when the outbox writes thousands at once.
_TO_ALPHABET = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", ALPHABET)


def new_ids(prefix: str, count: int) -> list[str]:
    """``count`` fresh IDs with ``prefix``."""
    if prefix not in PREFIXES:
        raise ValueError(f"unknown id prefix {prefix!r}")
    chars = count * RANDOM_LENGTH
    digits = base64.b32encode(secrets.token_bytes(5 * -(-chars // 8))).decode()
    digits = digits.translate(_TO_ALPHABET)
    return [f"{prefix}_{digits[i : i + RANDOM_LENGTH]}" for i in range(0, chars, RANDOM_LENGTH)]


def new_id(prefix: str) -> str:
    return new_ids(prefix, 1)[0]


def id_prefix(value: str) -> str | None:
    """The prefix of a well-formed ID, or None when ``value`` is not one of ours."""
    match = _ID_RE.match(value)
    if match is None or match.group(1) not in PREFIXES:
        return None
    return match.group(1)


def stable_id(prefix: str, seed: str) -> str:
    """An id of ``prefix`` derived from ``seed``: the same seed always gives the same id
    (a dedupe key for something that must happen once per seed, e.g. one notice per
    command)."""
    if prefix not in PREFIXES:
        raise ValueError(f"unknown id prefix {prefix!r}")
    digest = hashlib.sha256(f"{prefix}:{seed}".encode()).digest()
    digits = base64.b32encode(digest).decode().translate(_TO_ALPHABET)
    return f"{prefix}_{digits[:RANDOM_LENGTH]}"
