"""The server URL rules of the link's trust (endpointd.link.trust)."""

from __future__ import annotations

import pytest

from endpointd.errors import TrustError
from endpointd.link.trust import is_loopback, parse_server_url


def test_url_rules() -> None:
    assert parse_server_url("https://gw.example.com").port == 443
    assert parse_server_url("https://[::1]:8443").target == "[::1]:8443"
    assert parse_server_url("http://localhost:9").scheme == "http"
    assert parse_server_url("http://127.0.0.2:9").host == "127.0.0.2"
    assert is_loopback("::1")
    assert not is_loopback("localhost.example.com")
    with pytest.raises(TrustError, match="plaintext"):
        parse_server_url("http://192.168.1.2:80")
