"""Which addresses a name may lead the proxy to (endpointd/secrets/egress_address.py)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from endpointd.secrets import egress_address


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.9.9.9",
        "::1",
        "169.254.169.254",  # a cloud VM's metadata service
        "fe80::1%2",
        "0.0.0.0",  # noqa: S104 (an address to judge, never bound)
        "::",
        "224.0.0.1",
        "::ffff:127.0.0.1",  # IPv4 inside IPv6 is the same place
        "::ffff:169.254.169.254",
    ],
)
def test_this_machine_and_its_link_are_local(address: str) -> None:
    assert egress_address._local(address)


@pytest.mark.parametrize("address", ["93.184.216.34", "10.1.2.3", "192.168.1.10", "2001:db8::1"])
def test_other_hosts_are_not(address: str) -> None:
    assert not egress_address._local(address)


def test_a_name_leading_only_here_is_refused_and_a_mixed_one_goes_elsewhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answers = {
        "metadata.example": ["169.254.169.254"],
        "mixed.example": ["127.0.0.1", "93.184.216.34"],
    }

    async def getaddrinfo(host: str, port: int, **_: Any) -> list[Any]:
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in answers[host]]

    async def check() -> None:
        loop = asyncio.get_running_loop()
        monkeypatch.setattr(loop, "getaddrinfo", getaddrinfo)
        with pytest.raises(egress_address.LocalAddress):
            await egress_address.vetted("metadata.example", 80)
        assert await egress_address.vetted("mixed.example", 443) == "93.184.216.34"
        # What the owner wrote literally is theirs to mean.
        assert await egress_address.vetted("127.0.0.1", 8443) == "127.0.0.1"
        assert await egress_address.vetted("localhost", 8443) == "localhost"

    asyncio.run(check())
