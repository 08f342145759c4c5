"""The device's Ed25519 identity key: creation, storage, loading, deletion.

The private half lives in the OS keyring (service ``superagent-endpointd``) by default. A
file is used only when the user passes ``--key-file`` explicitly, and then it must be 0600:
like ssh, a key other local users could read is refused rather than silently used. The
keyring entry is named after the public key's hash, so two daemons with different config
dirs on one machine never overwrite each other's key.

Heavy imports (``keyring`` probes D-Bus on Linux) happen inside the functions that need
them so `endpointd --help` stays instant.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from endpointd.config import KeyConfig
from endpointd.errors import KeyStorageError

KEYRING_SERVICE = "superagent-endpointd"

NO_KEYRING_FIX = (
    "install or configure an OS keyring backend (gnome-keyring or KWallet on Linux,"
    " Keychain on macOS, Credential Locker on Windows), or pass --key-file PATH to keep"
    " the key in a 0600 file instead"
)


@dataclass(frozen=True)
class KeyringStatus:
    """Which keyring backend the daemon would store its device key in, and whether it can."""

    backend: str  # display name, e.g. "SecretService Keyring"
    backend_class: str  # import path, what PYTHON_KEYRING_BACKEND would name
    usable: bool
    detail: str


def keyring_status() -> KeyringStatus:
    """Probe the OS keyring the way pairing will, without reading or writing any secret."""
    import keyring
    from keyring.backends import chainer, fail, null

    try:
        backend = keyring.get_keyring()
    except Exception as exc:
        # `info` is the diagnostic people run when something is wrong, so a broken keyring
        # setup (e.g. PYTHON_KEYRING_BACKEND naming a missing module) is reported, not raised.
        return KeyringStatus(
            backend="(failed to load)",
            backend_class="",
            usable=False,
            detail=f"keyring failed to load: {type(exc).__name__}: {exc}",
        )
    cls = type(backend)
    backend_class = f"{cls.__module__}.{cls.__qualname__}"
    usable, detail = True, "device keys will be stored here"
    if isinstance(backend, fail.Keyring):
        # keyring's answer when it found no backend at all (typical on a headless Linux box
        # without Secret Service): every operation would raise.
        usable, detail = False, "no OS keyring backend is available"
    elif isinstance(backend, null.Keyring):
        usable, detail = False, "the keyring is disabled by configuration (null backend)"
    elif isinstance(backend, chainer.ChainerBackend):
        chained = list(backend.backends)
        if not chained:
            usable, detail = False, "the keyring chain contains no usable backend"
        else:
            detail = "chains: " + ", ".join(str(b.name) for b in chained)
    return KeyringStatus(
        backend=str(backend.name), backend_class=backend_class, usable=usable, detail=detail
    )


@dataclass(frozen=True)
class DeviceKey:
    private: Ed25519PrivateKey

    @property
    def public_raw(self) -> bytes:
        return self.private.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )

    def sign(self, data: bytes) -> bytes:
        return self.private.sign(data)

    def _raw_private(self) -> bytes:
        return self.private.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )


def _keyring_username(public_raw: bytes) -> str:
    return "device-key-" + hashlib.sha256(public_raw).hexdigest()[:16]


def create_key(key_file: Path | None) -> tuple[DeviceKey, KeyConfig, bool]:
    """A key for pairing, stored where it will live: (key, where, newly created?).

    With ``key_file`` an existing 0600 key file is reused (re-pairing after `unpair
    --keep-key`, or a key provisioned by configuration management); otherwise a new key is
    created there with 0600. Without it a new key goes to the keyring, which must be usable.
    """
    if key_file is not None:
        path = Path(os.path.abspath(os.path.expanduser(key_file)))
        if path.exists():
            return _load_file(path), KeyConfig(storage="file", path=str(path)), False
        key = DeviceKey(Ed25519PrivateKey.generate())
        _write_key_file(path, key)
        return key, KeyConfig(storage="file", path=str(path)), True

    status = keyring_status()
    if not status.usable:
        raise KeyStorageError(
            f"cannot store the device key: {status.detail} ({status.backend}); {NO_KEYRING_FIX}"
        )
    import keyring
    import keyring.errors

    key = DeviceKey(Ed25519PrivateKey.generate())
    username = _keyring_username(key.public_raw)
    try:
        keyring.set_password(
            KEYRING_SERVICE, username, base64.b64encode(key._raw_private()).decode()
        )
    except keyring.errors.KeyringError as exc:
        raise KeyStorageError(
            f"cannot store the device key in the keyring ({status.backend}): {exc};"
            f" {NO_KEYRING_FIX}"
        ) from None
    return key, KeyConfig(storage="keyring", service=KEYRING_SERVICE, username=username), True


def _write_key_file(path: Path, key: DeviceKey) -> None:
    pem = key.private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # O_EXCL: never follow a pre-planted symlink or clobber a file created meanwhile;
        # the mode is applied at creation so the key is never readable by others.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise KeyStorageError(f"cannot create key file {path}: {exc.strerror}") from None
    try:
        os.write(fd, pem)
        os.fsync(fd)
    finally:
        os.close(fd)


def _load_file(path: Path) -> DeviceKey:
    try:
        st = path.stat()
        if os.name == "posix" and st.st_mode & 0o077:
            raise KeyStorageError(
                f"key file {path} has permissions {stat.filemode(st.st_mode)}; it must not be"
                f" readable by others: run `chmod 600 {path}` (and check nobody copied it)"
            )
        data = path.read_bytes()
    except OSError as exc:
        raise KeyStorageError(f"cannot read key file {path}: {exc.strerror}") from None
    try:
        private = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise KeyStorageError(f"key file {path} is not an unencrypted PEM key: {exc}") from None
    if not isinstance(private, Ed25519PrivateKey):
        raise KeyStorageError(f"key file {path} does not hold an Ed25519 key")
    return DeviceKey(private)


def load_key(where: KeyConfig) -> DeviceKey:
    if where.storage == "file":
        return _load_file(Path(where.path))
    import keyring
    import keyring.errors

    try:
        value = keyring.get_password(where.service, where.username)
    except keyring.errors.KeyringError as exc:
        raise KeyStorageError(
            f"cannot read the device key from the keyring: {exc}; is the keyring unlocked?"
        ) from None
    if value is None:
        raise KeyStorageError(
            f"the device key ({where.service}/{where.username}) is missing from the keyring;"
            " re-pair with `endpointd unpair` then `endpointd pair`"
        )
    try:
        return DeviceKey(Ed25519PrivateKey.from_private_bytes(base64.b64decode(value)))
    except ValueError as exc:
        raise KeyStorageError(f"the keyring entry for the device key is corrupt: {exc}") from None


def delete_key(where: KeyConfig) -> bool:
    """Remove the private key; False if it was already gone."""
    if where.storage == "file":
        try:
            os.unlink(where.path)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise KeyStorageError(f"cannot delete key file {where.path}: {exc.strerror}") from None
        return True
    import keyring
    import keyring.errors

    try:
        keyring.delete_password(where.service, where.username)
    except keyring.errors.PasswordDeleteError:
        return False
    except keyring.errors.KeyringError as exc:
        raise KeyStorageError(f"cannot delete the device key from the keyring: {exc}") from None
    return True


def discard_new_key(key: DeviceKey, where: KeyConfig) -> None:
    """Undo :func:`create_key` after a failed pairing, so no orphaned secret is left."""
    with contextlib.suppress(Exception):
        delete_key(where)
