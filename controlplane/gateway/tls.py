"""The gateway's own certificate authority and server certificate.

On first start the control plane creates a private CA (10 years) and a server certificate
it signs (1 year, renewed on start when within 30 days of expiry, same CA). Devices pin the
CA at pairing, so renewal never requires re-pairing. The server certificate always names
``superagent-gateway``: pinned devices verify against that name whatever address they
dial. Deployments behind a TLS-terminating proxy with a public certificate turn this off
(``SUPERAGENT_GRPC__TLS=off``) and let the proxy present its certificate.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

GATEWAY_NAME = "superagent-gateway"
_RENEW_BEFORE = dt.timedelta(days=30)


@dataclass(frozen=True)
class ServerTls:
    ca_pem: bytes
    cert_pem: bytes  # the leaf followed by the CA: devices see the whole chain
    key_pem: bytes
    leaf_sha256: bytes

    @property
    def fingerprint(self) -> str:
        return "sha256:" + self.leaf_sha256.hex()


def _write_private(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _new_ca(now: dt.datetime) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Super-agent gateway CA")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _new_leaf(
    ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, names: list[str], now: dt.datetime
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    alt: list[x509.GeneralName] = []
    for name in dict.fromkeys([GATEWAY_NAME, "localhost", *names]):
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alt.append(x509.DNSName(name))
    for ip in ("127.0.0.1", "::1"):
        if x509.IPAddress(ipaddress.ip_address(ip)) not in alt:
            alt.append(x509.IPAddress(ipaddress.ip_address(ip)))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, GATEWAY_NAME)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def ensure_server_tls(directory: Path, extra_names: list[str] | None = None) -> ServerTls:
    """Load the CA and server certificate from ``directory``, creating or renewing them."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    ca_cert_path, ca_key_path = directory / "ca.pem", directory / "ca.key"
    cert_path, key_path = directory / "server.pem", directory / "server.key"
    now = dt.datetime.now(dt.UTC)

    if ca_cert_path.exists() and ca_key_path.exists():
        ca = x509.load_pem_x509_certificate(ca_cert_path.read_bytes())
        loaded = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
        assert isinstance(loaded, ec.EllipticCurvePrivateKey)
        ca_key = loaded
    else:
        ca, ca_key = _new_ca(now)
        _write_private(ca_key_path, _pem_key(ca_key))
        _write_private(ca_cert_path, ca.public_bytes(serialization.Encoding.PEM))

    names = [socket.gethostname(), *(extra_names or [])]
    leaf: x509.Certificate | None = None
    if cert_path.exists() and key_path.exists():
        leaf = x509.load_pem_x509_certificate(cert_path.read_bytes())
        if leaf.not_valid_after_utc - now < _RENEW_BEFORE or leaf.issuer != ca.subject:
            leaf = None
    if leaf is None:
        leaf, leaf_key = _new_leaf(ca, ca_key, names, now)
        _write_private(key_path, _pem_key(leaf_key))
        _write_private(cert_path, leaf.public_bytes(serialization.Encoding.PEM))

    ca_pem = ca.public_bytes(serialization.Encoding.PEM)
    leaf_pem = leaf.public_bytes(serialization.Encoding.PEM)
    return ServerTls(
        ca_pem=ca_pem,
        cert_pem=leaf_pem + ca_pem,
        key_pem=key_path.read_bytes(),
        leaf_sha256=hashlib.sha256(leaf.public_bytes(serialization.Encoding.DER)).digest(),
    )
