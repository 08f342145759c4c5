"""Deciding whether to trust the server: URL rules, the pairing-time TLS probe, and the
gRPC channel credentials every later connection uses.

Pairing is trust-on-first-use with pinning. Before sending the pairing code anywhere the
daemon opens a raw TLS connection and looks at what the server presents:

* if the chain verifies against the system's roots for the dialled host name, the server has
  a public certificate (typically a TLS-terminating proxy) and normal verification is used
  from then on (mode ``system``);
* otherwise the server must present exactly ``[leaf, CA]`` with the leaf signed by that CA;
  the CA becomes the only trust root, and the leaf is checked for the fixed name
  ``superagent-gateway`` (mode ``pinned``). An admin-supplied fingerprint, when given, must
  match the leaf - the defence against an interceptor on the very first connection.

``http://`` is accepted for loopback hosts only (tests, the control plane's embedded daemon):
a pairing code or device traffic in clear text over a real network is never acceptable.
"""

from __future__ import annotations

import hashlib
import ipaddress
import socket
import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from endpointd.config import TrustConfig
from endpointd.errors import TrustError
from superagent_shared.gateway_tls import GATEWAY_TLS_SERVER_NAME, format_fingerprint

if TYPE_CHECKING:
    import grpc

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain"})


@dataclass(frozen=True)
class ServerAddress:
    scheme: Literal["https", "http"]
    host: str
    port: int

    @property
    def target(self) -> str:
        """``host:port`` as gRPC wants it (IPv6 literals in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.target}"


def is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_server_url(url: str) -> ServerAddress:
    """Validate ``https://host[:port]`` or loopback-only ``http://host:port``."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    if scheme not in ("https", "http") or not parts.hostname:
        raise TrustError(
            f"server URL must look like https://HOST:PORT (or http://127.0.0.1:PORT for a local"
            f" test server), got {url!r}"
        )
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise TrustError(f"server URL must be just scheme, host and port, got {url!r}")
    try:
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError:
        raise TrustError(f"server URL has an invalid port: {url!r}") from None
    host = parts.hostname
    if scheme == "http" and not is_loopback(host):
        raise TrustError(
            f"refusing plaintext http:// to {host}: the pairing code and all device traffic"
            " would cross the network unencrypted; use https:// (plaintext is allowed only"
            " for loopback addresses such as 127.0.0.1)"
        )
    return ServerAddress(scheme="https" if scheme == "https" else "http", host=host, port=port)


@dataclass(frozen=True)
class ProbeResult:
    """What the server presented on the pairing-time TLS probe."""

    mode: Literal["system", "pinned"]
    leaf_der: bytes
    ca_der: bytes  # empty in system mode

    @property
    def leaf_sha256(self) -> bytes:
        return hashlib.sha256(self.leaf_der).digest()

    @property
    def ca_pem(self) -> str:
        if not self.ca_der:
            return ""
        cert = x509.load_der_x509_certificate(self.ca_der)
        return cert.public_bytes(serialization.Encoding.PEM).decode("ascii")


def _connect(
    addr: ServerAddress, context: ssl.SSLContext, timeout: float
) -> tuple[ssl.SSLSocket, socket.socket]:
    raw = socket.create_connection((addr.host, addr.port), timeout=timeout)
    try:
        # An IP literal is fine here: ssl then checks IP SANs and sends no SNI.
        return context.wrap_socket(raw, server_hostname=addr.host), raw
    except BaseException:
        raw.close()
        raise


def _unverified_chain(sock: ssl.SSLSocket) -> list[bytes]:
    # Python 3.13 made this public; on 3.10-3.12 it exists only on the C-level object.
    getter: Any = getattr(sock, "get_unverified_chain", None)
    if getter is None:
        getter = sock._sslobj.get_unverified_chain  # type: ignore[attr-defined]
    chain = getter() or []
    out: list[bytes] = []
    for cert in chain:
        out.append(cert if isinstance(cert, bytes) else cert.public_bytes(ssl._ssl.ENCODING_DER))  # type: ignore[attr-defined]
    return out


def probe_server(addr: ServerAddress, *, timeout: float = 15.0) -> ProbeResult:
    """Handshake with the server and classify its certificate (see the module docstring)."""
    system = ssl.create_default_context()
    system.set_alpn_protocols(["h2"])
    try:
        sock, _ = _connect(addr, system, timeout)
    except ssl.SSLCertVerificationError:
        pass  # not publicly trusted: fall through to the pinned (self-signed CA) path
    except ssl.SSLError as exc:
        raise TrustError(f"TLS handshake with {addr.target} failed: {exc.reason or exc}") from None
    except OSError as exc:
        raise TrustError(f"cannot reach {addr.target}: {exc.strerror or exc}") from None
    else:
        with sock:
            leaf = sock.getpeercert(binary_form=True) or b""
        return ProbeResult(mode="system", leaf_der=leaf, ca_der=b"")

    unverified = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    unverified.check_hostname = False
    # Verification is done below by hand, against the CA the server itself presents; the
    # pinning (and optional fingerprint) is what makes that meaningful.
    unverified.verify_mode = ssl.CERT_NONE
    unverified.set_alpn_protocols(["h2"])
    try:
        sock, _ = _connect(addr, unverified, timeout)
    except ssl.SSLError as exc:
        raise TrustError(f"TLS handshake with {addr.target} failed: {exc.reason or exc}") from None
    except OSError as exc:
        raise TrustError(f"cannot reach {addr.target}: {exc.strerror or exc}") from None
    with sock:
        chain = _unverified_chain(sock)
    return ProbeResult(
        mode="pinned", leaf_der=chain[0] if chain else b"", ca_der=_check_pinned_chain(addr, chain)
    )


def _check_pinned_chain(addr: ServerAddress, chain: list[bytes]) -> bytes:
    """Validate a self-signed deployment's ``[leaf, CA]`` chain; return the CA's DER."""
    if len(chain) != 2:
        raise TrustError(
            f"{addr.target} presents a certificate that is not publicly trusted and a chain of"
            f" {len(chain)} certificate(s); a self-signed superagent gateway presents exactly"
            " [leaf, CA]. Is this the right address?"
        )
    try:
        leaf = x509.load_der_x509_certificate(chain[0])
        ca = x509.load_der_x509_certificate(chain[1])
    except ValueError as exc:
        raise TrustError(f"{addr.target} presented an unparsable certificate: {exc}") from None
    try:
        basic = ca.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        basic = None
    if basic is None or not basic.ca:
        raise TrustError(f"the second certificate {addr.target} presents is not a CA")
    try:
        ca.verify_directly_issued_by(ca)
        leaf.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        raise TrustError(
            f"{addr.target} presents a leaf certificate its CA did not sign; refusing to pair"
        ) from None
    try:
        sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = sans.get_values_for_type(x509.DNSName)
    except x509.ExtensionNotFound:
        names = []
    if GATEWAY_TLS_SERVER_NAME not in names:
        raise TrustError(
            f"{addr.target}'s certificate is not a superagent gateway certificate (no DNS name"
            f" {GATEWAY_TLS_SERVER_NAME!r}); is this the right address?"
        )
    return chain[1]


def check_fingerprint(probe: ProbeResult, expected: bytes | None) -> None:
    if expected is not None and probe.leaf_sha256 != expected:
        raise TrustError(
            "certificate fingerprint mismatch — possible interception: the server presented"
            f" {format_fingerprint(probe.leaf_sha256)} but you expected"
            f" {format_fingerprint(expected)}; not pairing"
        )


def channel_credentials(trust: TrustConfig) -> grpc.ChannelCredentials | None:
    """gRPC credentials for ``trust`` (None means a plaintext channel)."""
    import grpc

    if trust.mode == "plaintext":
        return None
    if trust.mode == "pinned":
        return grpc.ssl_channel_credentials(root_certificates=trust.ca_pem.encode("ascii"))
    return grpc.ssl_channel_credentials()


def channel_options(trust: TrustConfig) -> list[tuple[str, Any]]:
    if trust.mode == "pinned":
        # The pinned CA is the trust root; the leaf is checked for the fixed gateway name
        # rather than whatever host or IP the device dials.
        return [("grpc.ssl_target_name_override", GATEWAY_TLS_SERVER_NAME)]
    return []
