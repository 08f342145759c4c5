"""The device's own certificate authority, for the credential proxy's TLS interception.

The http delivery (:mod:`endpointd.secrets.proxy`) terminates a command's TLS to a
credential's hosts in order to add the credential's header, so the command must trust the
certificate the proxy shows. That certificate comes from this CA:

* one EC P-256 CA per device, made on first use. Its private key lives in the OS keyring
  (service ``superagent-endpointd``, entry ``device-ca-<hash of its public key>``: not a
  ``credential:`` entry, so ``endpointd creds list``, which lists the credential index,
  never shows it); its certificate, which is public, in ``<config dir>/device-ca.pem``.
  Without a usable keyring the CA lives in the daemon's memory only, for as long as it runs
  (commands get a fresh bundle each, so nothing depends on it lasting).
* leaf certificates per host (SAN = the host name, or its IP address), valid for a day,
  made on demand and kept in memory; their key never touches a disk (a memfd on Linux, an
  unlinked file in a private directory elsewhere, just long enough for ``ssl`` to load it).
* a CA bundle per command (:func:`write_bundle`): the system's trust store plus this CA, so
  that the command trusts both the proxy and every host the proxy merely tunnels.

Only the commands run through the proxy are given this CA; the system trust store is never
changed.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import ipaddress
import logging
import os
import re
import ssl
import tempfile
import threading
import time
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from endpointd.fsutil import atomic_write
from endpointd.paths import ensure_private_dir
from superagent_shared.gateway_tls import self_signed_ca

__all__ = [
    "BUNDLE_FILE",
    "CA_CERT_FILE",
    "DeviceCA",
    "device_ca",
    "loaded_keys",
    "system_trust_pem",
    "write_bundle",
]

log = logging.getLogger(__name__)

CA_CERT_FILE = "device-ca.pem"
BUNDLE_FILE = "ca-bundle.pem"
KEYRING_SERVICE = "superagent-endpointd"  # as the device key and the credentials
KEYRING_PREFIX = "device-ca-"
CA_VALIDITY = dt.timedelta(days=3650)
LEAF_VALIDITY = dt.timedelta(days=1)
# A cached leaf is replaced when less than this much of its validity is left.
LEAF_RENEW_MARGIN = 3600.0
_BACKDATE = dt.timedelta(hours=1)  # clocks differ a little between processes' views
_MAX_TRUST_FILE = 16 * 1024 * 1024
_PEM_CERT = re.compile(
    rb"-----BEGIN CERTIFICATE-----\r?\n[A-Za-z0-9+/=\r\n]+?-----END CERTIFICATE-----"
)
# Where distributions keep the system trust store as one file, most common first.
_SYSTEM_BUNDLES = (
    "/etc/ssl/certs/ca-certificates.crt",  # Debian, Ubuntu, Alpine, Arch
    "/etc/pki/tls/certs/ca-bundle.crt",  # Fedora, RHEL
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/ca-bundle.pem",  # openSUSE
    "/etc/ssl/cert.pem",  # macOS, BSDs
    "/usr/local/etc/openssl/cert.pem",
    "/opt/homebrew/etc/openssl@3/cert.pem",
)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _entry_name(public: ec.EllipticCurvePublicKey) -> str:
    der = public.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return KEYRING_PREFIX + hashlib.sha256(der).hexdigest()[:16]


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


class DeviceCA:
    """A CA key and certificate, and the leaf certificates made from them (thread-safe).

    ``repr`` shows the certificate's fingerprint, never a key.
    """

    def __init__(
        self, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate, *, persisted: bool
    ) -> None:
        self._key = key
        self.cert = cert
        self.persisted = persisted  # False: in this process's memory only
        self.cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        self._leaf_key = ec.generate_private_key(ec.SECP256R1())
        self._leaves: dict[str, tuple[ssl.SSLContext, float]] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        digest = self.cert.fingerprint(hashes.SHA256()).hex()[:16]
        return f"DeviceCA(sha256={digest}, persisted={self.persisted})"

    @classmethod
    def generate(cls, *, persisted: bool = False) -> DeviceCA:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name(
            [
                x509.NameAttribute(NameOID.COMMON_NAME, "endpointd device CA"),
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "superagent endpointd"),
            ]
        )
        now = _now()
        cert = self_signed_ca(key, name, now - _BACKDATE, now + CA_VALIDITY)
        return cls(key, cert, persisted=persisted)

    def matches(self, key: ec.EllipticCurvePrivateKey) -> bool:
        mine = self.cert.public_key()
        return isinstance(mine, ec.EllipticCurvePublicKey) and mine.public_numbers() == (
            key.public_key().public_numbers()
        )

    # ------------------------------------------------------------------ leaves

    def leaf_pem(self, host: str) -> tuple[bytes, bytes]:
        """A fresh leaf certificate for ``host`` and its key, both PEM (the key is secret)."""
        now = _now()
        try:
            san: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            san = x509.DNSName(host)
        issuer_key = self.cert.public_key()
        assert isinstance(issuer_key, ec.EllipticCurvePublicKey)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])]))
            .issuer_name(self.cert.subject)
            .public_key(self._leaf_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + LEAF_VALIDITY)
            .add_extension(x509.SubjectAlternativeName([san]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key), critical=False
            )
            .sign(self._key, hashes.SHA256())
        )
        return cert.public_bytes(serialization.Encoding.PEM), _key_pem(self._leaf_key)

    def server_context(self, host: str) -> ssl.SSLContext:
        """A TLS server context presenting a leaf for ``host`` (ALPN: http/1.1 only)."""
        host = host.lower()
        with self._lock:
            cached = self._leaves.get(host)
            if cached is not None and cached[1] - time.time() > LEAF_RENEW_MARGIN:
                return cached[0]
            cert_pem, key_pem = self.leaf_pem(host)
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.set_alpn_protocols(["http/1.1"])
            _load_chain(context, cert_pem + self.cert_pem + key_pem)
            expires = time.time() + LEAF_VALIDITY.total_seconds()
            if len(self._leaves) > 1024:
                self._leaves.clear()
            self._leaves[host] = (context, expires)
            return context


def _load_chain(context: ssl.SSLContext, pem: bytes) -> None:
    """``load_cert_chain`` from memory: ``ssl`` only reads files, so the PEM (which holds the
    leaf key) goes in a memfd, or a 0600 file in a private directory removed at once."""
    memfd_create = getattr(os, "memfd_create", None)
    if memfd_create is not None and os.path.isdir("/proc/self/fd"):
        fd = memfd_create("endpointd-leaf", getattr(os, "MFD_CLOEXEC", 0))
        try:
            os.write(fd, pem)
            context.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        return
    directory = tempfile.mkdtemp(prefix="endpointd-leaf-")
    path = os.path.join(directory, "leaf.pem")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, pem)
        finally:
            os.close(fd)
        context.load_cert_chain(path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        with contextlib.suppress(OSError):
            os.rmdir(directory)


# ---------------------------------------------------------------------- the device's CA


def _keyring_get(entry: str) -> bytes | None:
    import keyring
    import keyring.errors

    try:
        value = keyring.get_password(KEYRING_SERVICE, entry)
    except keyring.errors.KeyringError:
        return None
    return None if value is None else str(value).encode()


def _keyring_set(entry: str, value: bytes) -> bool:
    import keyring
    import keyring.errors

    try:
        keyring.set_password(KEYRING_SERVICE, entry, value.decode())
    except keyring.errors.KeyringError:
        return False
    return True


def _keyring_usable() -> bool:
    from endpointd.keys import keyring_status

    return keyring_status().usable


def _load(config_dir: Path) -> DeviceCA | None:
    path = config_dir / CA_CERT_FILE
    try:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("ignoring the device CA certificate %s: %s", path, exc)
        return None
    public = cert.public_key()
    if not isinstance(public, ec.EllipticCurvePublicKey):
        return None
    if cert.not_valid_after_utc - _now() < dt.timedelta(days=30):
        return None  # about to expire: make a new one
    stored = _keyring_get(_entry_name(public))
    if stored is None:
        return None
    try:
        key = serialization.load_pem_private_key(stored, password=None)
    except (ValueError, TypeError):
        return None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        return None
    ca = DeviceCA(key, cert, persisted=True)
    return ca if ca.matches(key) else None


def load_or_create(config_dir: Path) -> DeviceCA:
    """The device CA of ``config_dir``: the stored one, else a new one, stored if possible."""
    usable = _keyring_usable()
    if usable:
        found = _load(config_dir)
        if found is not None:
            return found
    ca = DeviceCA.generate(persisted=False)
    if not usable:
        log.warning(
            "no usable OS keyring: the device CA for http credential delivery lives in this"
            " daemon's memory only"
        )
        return ca
    public = ca.cert.public_key()
    assert isinstance(public, ec.EllipticCurvePublicKey)
    if not _keyring_set(_entry_name(public), _key_pem(ca._key)):
        log.warning("cannot store the device CA key in the keyring; keeping it in memory only")
        return ca
    ensure_private_dir(config_dir)
    atomic_write(config_dir / CA_CERT_FILE, ca.cert_pem, mode=0o644)
    ca.persisted = True
    return ca


_CACHE: dict[Path, DeviceCA] = {}
_CACHE_LOCK = threading.Lock()


def device_ca(config_dir: Path) -> DeviceCA:
    """:func:`load_or_create`, once per process and config dir (blocking: keyring access)."""
    key = Path(os.path.abspath(config_dir))
    with _CACHE_LOCK:
        ca = _CACHE.get(key)
        if ca is None:
            ca = load_or_create(key)
            _CACHE[key] = ca
        return ca


def loaded_keys() -> list[bytes]:
    """What gives away the private keys of the device CAs this process has loaded, for the
    redactor: each raw 32-byte scalar, and each base64 line of its PEM (the scalar's base64
    straddles a line break there, so the lines are masked on their own; not the armour)."""
    found: list[bytes] = []
    with _CACHE_LOCK:
        keys = [ca._key for ca in _CACHE.values()]
    for key in keys:
        found.append(key.private_numbers().private_value.to_bytes(32, "big"))
        found += [line for line in _key_pem(key).splitlines() if not line.startswith(b"-----")]
    return found


# ------------------------------------------------------------------------ the bundle


def _trust_files() -> list[str]:
    """The trust store files to copy: what ``SSL_CERT_FILE`` or OpenSSL's default names,
    plus the distribution's bundle when that is another file."""
    paths = ssl.get_default_verify_paths()
    chosen: list[str] = []
    seen: set[str] = set()

    def add(path: str | None) -> bool:
        if not path or not os.path.isfile(path):
            return False
        real = os.path.realpath(path)
        if real not in seen:
            seen.add(real)
            chosen.append(path)
        return True

    add(paths.cafile)
    system = [*_SYSTEM_BUNDLES, paths.openssl_cafile]
    with contextlib.suppress(ImportError):
        import certifi

        system.append(certifi.where())
    for candidate in system:
        if add(candidate):
            break
    return chosen


def _certificates(data: bytes) -> list[bytes]:
    """The PEM certificates in ``data``, and nothing else (never a key that sat beside them)."""
    return [m.group(0).replace(b"\r\n", b"\n") for m in _PEM_CERT.finditer(data)]


def system_trust_pem() -> bytes:
    """The system trust store as PEM certificates (empty when none is found)."""
    blocks: list[bytes] = []
    files = _trust_files()
    for path in files:
        try:
            with open(path, "rb") as handle:
                blocks += _certificates(handle.read(_MAX_TRUST_FILE))
        except OSError:
            continue
    if not blocks:
        capath = ssl.get_default_verify_paths().capath
        if capath and os.path.isdir(capath):
            for name in sorted(os.listdir(capath)):
                with (
                    contextlib.suppress(OSError),
                    open(os.path.join(capath, name), "rb") as handle,
                ):
                    blocks += _certificates(handle.read(_MAX_TRUST_FILE))
    unique = list(dict.fromkeys(blocks))
    return b"\n".join(unique) + (b"\n" if unique else b"")


def write_bundle(directory: Path, ca: DeviceCA) -> Path:
    """``directory/ca-bundle.pem`` (0644): the system trust store plus the device CA."""
    path = directory / BUNDLE_FILE
    body = system_trust_pem() + b"# endpointd device CA (the credential proxy)\n" + ca.cert_pem
    atomic_write(path, body, mode=0o644, fsync=False)
    return path
