"""The gateway's certificate files: create them once, renew the server certificate in time.

On first start the control plane creates a private CA (10 years) and a server certificate it
signs, in the state directory. The certificate is renewed on start when within 30 days of
expiry, by the same CA: devices pin the CA at pairing, so renewal never requires re-pairing.
The material itself (names, key types, the fingerprint format) comes from
``superagent_shared.gateway_tls``, which endpointd shares. Deployments behind a
TLS-terminating proxy with a public certificate turn this off (``SUPERAGENT_GRPC__TLS=off``).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from controlplane.settings import Settings
from superagent_shared.gateway_tls import (
    GATEWAY_TLS_SERVER_NAME,
    certificate_sha256,
    format_fingerprint,
    generate_gateway_certificates,
    issue_gateway_certificate,
)

GATEWAY_NAME = GATEWAY_TLS_SERVER_NAME
_RENEW_BEFORE = dt.timedelta(days=30)


@dataclass(frozen=True)
class ServerTls:
    ca_pem: bytes
    cert_pem: bytes  # the leaf followed by the CA: devices see the whole chain
    key_pem: bytes
    leaf_sha256: bytes

    @property
    def fingerprint(self) -> str:
        return format_fingerprint(self.leaf_sha256)


def _write_private(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)


def _split_names(names: list[str]) -> tuple[list[str], list[str]]:
    dns: list[str] = []
    ips: list[str] = []
    for name in dict.fromkeys(["localhost", *names, "127.0.0.1", "::1"]):
        try:
            ipaddress.ip_address(name)
        except ValueError:
            dns.append(name)
        else:
            ips.append(name)
    return dns, ips


def _needs_new_leaf(cert_path: Path, ca_pem: bytes) -> bool:
    if not cert_path.exists():
        return True
    leaf = x509.load_pem_x509_certificate(cert_path.read_bytes())
    ca = x509.load_pem_x509_certificate(ca_pem)
    left = leaf.not_valid_after_utc - dt.datetime.now(dt.UTC)
    return left < _RENEW_BEFORE or leaf.issuer != ca.subject


def ensure_server_tls(directory: Path, extra_names: list[str] | None = None) -> ServerTls:
    """Load the CA and server certificate from ``directory``, creating or renewing them."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    ca_cert, ca_key = directory / "ca.pem", directory / "ca.key"
    cert, key = directory / "server.pem", directory / "server.key"
    dns, ips = _split_names([socket.gethostname(), *(extra_names or [])])
    if not (ca_cert.exists() and ca_key.exists()):
        fresh = generate_gateway_certificates(extra_dns_names=dns, extra_ips=ips)
        _write_private(ca_key, fresh.ca_key_pem)
        _write_private(ca_cert, fresh.ca_pem)
        _write_private(key, fresh.key_pem)
        _write_private(cert, fresh.cert_pem)
    elif _needs_new_leaf(cert, ca_cert.read_bytes()) or not key.exists():
        cert_pem, key_pem = issue_gateway_certificate(
            ca_cert.read_bytes(), ca_key.read_bytes(), extra_dns_names=dns, extra_ips=ips
        )
        _write_private(key, key_pem)
        _write_private(cert, cert_pem)
    ca_pem, leaf_pem = ca_cert.read_bytes(), cert.read_bytes()
    return ServerTls(
        ca_pem=ca_pem,
        cert_pem=leaf_pem + ca_pem,
        key_pem=key.read_bytes(),
        leaf_sha256=certificate_sha256(leaf_pem),
    )


def gateway_tls(settings: Settings) -> ServerTls | None:
    """The gateway's certificate material, created on first start (None: TLS is off)."""
    if settings.grpc.tls == "off":
        return None
    names = [n.strip() for n in settings.grpc.tls_hostnames.split(",") if n.strip()]
    return ensure_server_tls(settings.state_dir / "tls", names)
