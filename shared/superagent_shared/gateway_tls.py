"""The gateway's self-signed TLS material and the fingerprint format both ends print.

A deployment without a publicly trusted certificate runs the device gateway on a private CA
that it creates itself; `endpointd pair` pins that CA (trust on first use, optionally checked
against a fingerprint the admin hands out). Everything both sides must agree on lives here:

* ``GATEWAY_TLS_SERVER_NAME`` - the DNS name every self-signed gateway leaf carries. The
  daemon verifies the server against this fixed name (gRPC's ``ssl_target_name_override``)
  rather than the host it dials, so an IP address, a NAT'd name or a later DNS rename all
  keep working without reissuing the certificate. The pinned CA is what makes it safe.
* ``generate_gateway_certificates`` / ``issue_gateway_certificate`` - a CA and a leaf it
  signed (ECDSA P-256, which every TLS stack gRPC uses supports).
* ``certificate_sha256``, ``format_fingerprint``, ``parse_fingerprint`` - what the admin
  reads off the server and passes to ``endpointd pair --fingerprint``.

Only ``cryptography`` (a daemon dependency) is used, so this module ships in the daemon wheel.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

GATEWAY_TLS_SERVER_NAME: Final = "superagent-gateway"

# Long enough that nobody is surprised by an expiry; the pinned CA outlives the leaf so the
# leaf can be reissued without re-pairing every device.
CA_VALIDITY: Final = dt.timedelta(days=3650)
LEAF_VALIDITY: Final = dt.timedelta(days=825)


@dataclass(frozen=True)
class GatewayCertificates:
    """PEM bytes of a private CA and the gateway leaf it issued (keys unencrypted)."""

    ca_pem: bytes
    ca_key_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    @property
    def cert_sha256(self) -> bytes:
        """What PairResponse.server_cert_sha256 must carry for this leaf."""
        return certificate_sha256(self.cert_pem)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _now() -> dt.datetime:
    # Backdated a little so a device whose clock runs slightly behind accepts a fresh cert.
    return dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)


def self_signed_ca(
    key: ec.EllipticCurvePrivateKey,
    name: x509.Name,
    not_before: dt.datetime,
    not_after: dt.datetime,
) -> x509.Certificate:
    """A CA certificate for ``key`` that may sign leaf certificates only (path length 0):
    the gateway's and each device's own (endpointd's http credential proxy)."""
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
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


def generate_gateway_certificates(
    *,
    extra_dns_names: Iterable[str] = (),
    extra_ips: Iterable[str] = (),
    ca_common_name: str = "superagent gateway CA",
) -> GatewayCertificates:
    """A fresh CA plus a leaf for ``GATEWAY_TLS_SERVER_NAME`` and the given extra names."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ca_common_name)])
    ca_cert = self_signed_ca(ca_key, name, _now(), _now() + CA_VALIDITY)
    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
    cert_pem, key_pem = issue_gateway_certificate(
        ca_pem, _key_pem(ca_key), extra_dns_names=extra_dns_names, extra_ips=extra_ips
    )
    return GatewayCertificates(
        ca_pem=ca_pem, ca_key_pem=_key_pem(ca_key), cert_pem=cert_pem, key_pem=key_pem
    )


def issue_gateway_certificate(
    ca_pem: bytes,
    ca_key_pem: bytes,
    *,
    extra_dns_names: Iterable[str] = (),
    extra_ips: Iterable[str] = (),
) -> tuple[bytes, bytes]:
    """A new leaf (cert PEM, key PEM) signed by an existing CA: renewal without re-pairing."""
    ca_cert = x509.load_pem_x509_certificate(ca_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the gateway CA key must be an ECDSA key")
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(GATEWAY_TLS_SERVER_NAME)]
    sans += [x509.DNSName(n) for n in extra_dns_names if n != GATEWAY_TLS_SERVER_NAME]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in extra_ips]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, GATEWAY_TLS_SERVER_NAME)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now())
        .not_valid_after(_now() + LEAF_VALIDITY)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def certificate_der(cert: bytes) -> bytes:
    """DER bytes of a certificate given as PEM or DER."""
    if cert.lstrip().startswith(b"-----BEGIN"):
        return x509.load_pem_x509_certificate(cert).public_bytes(serialization.Encoding.DER)
    return cert


def certificate_sha256(cert: bytes) -> bytes:
    """SHA-256 of the certificate's DER encoding (PEM or DER input)."""
    return hashlib.sha256(certificate_der(cert)).digest()


def format_fingerprint(digest: bytes) -> str:
    """``sha256:AB:CD:…`` - the form admins copy; :func:`parse_fingerprint` reads it back."""
    return "sha256:" + ":".join(f"{b:02X}" for b in digest)


_HEX_SEPARATORS = re.compile(r"[\s:]")


def parse_fingerprint(text: str) -> bytes:
    """Parse a SHA-256 fingerprint in hex, with optional ``sha256:`` prefix and colons."""
    value = text.strip()
    if value.lower().startswith("sha256:"):
        value = value[len("sha256:") :]
    value = _HEX_SEPARATORS.sub("", value)
    try:
        digest = bytes.fromhex(value)
    except ValueError:
        raise ValueError(f"not a hex SHA-256 fingerprint: {text!r}") from None
    if len(digest) != 32:
        raise ValueError(f"a SHA-256 fingerprint has 32 bytes, got {len(digest)}: {text!r}")
    return digest
