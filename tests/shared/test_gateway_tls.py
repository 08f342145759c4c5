"""Certificate fingerprints (superagent_shared.gateway_tls), as both programs spell them."""

from __future__ import annotations

import pytest

from superagent_shared.gateway_tls import format_fingerprint, parse_fingerprint


def test_fingerprints_round_trip_in_every_accepted_spelling() -> None:
    digest = bytes(range(32))
    text = format_fingerprint(digest)
    assert text.startswith("sha256:00:01:02")
    for spelling in (text, text.lower(), digest.hex(), digest.hex().upper(), text[7:]):
        assert parse_fingerprint(spelling) == digest
    with pytest.raises(ValueError, match="32 bytes"):
        parse_fingerprint("abcd")
    with pytest.raises(ValueError, match="not a hex"):
        parse_fingerprint("xyz")
