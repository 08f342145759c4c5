"""Where the proxy may connect for a host *name*: never this machine or its link.

Under ``network = "proxy"`` (and ``"deny"``) a command's network namespace leads only to its
proxy (:mod:`endpointd.guard.netns`), and the proxy runs in the daemon's namespace: it is
the one way to the machine's own services. A name the owner allowed can resolve to one of
them, without the owner ever meaning it: ``*.amazonaws.com`` covers
``ec2-169-254-169-254.compute-1.amazonaws.com`` (a cloud VM's metadata service, with its
credentials) and ``ec2-127-0-0-1…`` (this machine's loopback), and a name whose DNS an
attacker controls can point anywhere. So a name is resolved once, here, and the proxy
connects to an address that is not loopback, link-local, unspecified or multicast (IPv4,
IPv6, and IPv4 inside IPv6); it connects to that address, not the name again, so a second
answer cannot differ. An address written literally in the allow-list, and ``localhost``,
are the owner's explicit choice and are used as given.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket

__all__ = ["LocalAddress", "vetted"]

_EXPLICIT = frozenset({"localhost"})


class LocalAddress(Exception):
    """The name resolves only to addresses of this machine or its link."""


def _local(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast


def _literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


async def vetted(host: str, port: int) -> str:
    """The address to connect to for ``host:port``: ``host`` itself when it is an address
    or ``localhost``; else the first address it resolves to that is not local.
    :class:`LocalAddress` when every address is local; OSError when it does not resolve."""
    if _literal(host) or host.lower().rstrip(".") in _EXPLICIT:
        return host
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses = [str(info[4][0]) for info in infos]
    for address in addresses:
        if not _local(address):
            return address
    raise LocalAddress(f"{host} resolves to an address of this machine or its link")
