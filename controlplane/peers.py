"""Which peer an attempt is counted under, for every throttle (sign-ins, pairing codes)."""

from __future__ import annotations

import ipaddress


def peer_group(address: str | None) -> str:
    """An IPv4 address, or an IPv6 /64: one host usually holds a whole /64, so counting
    single IPv6 addresses would give it 2^64 tries. An IPv4-mapped IPv6 address is its
    IPv4 address; what is not an IP (a Unix socket) is counted as it is."""
    if not address:
        return "unknown"
    try:
        ip = ipaddress.ip_address(address.partition("%")[0])  # without an IPv6 zone
    except ValueError:
        return address[:100]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)
