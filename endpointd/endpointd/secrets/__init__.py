"""Secrets a command must never see, kept out of its reach and out of what leaves the device.

* :mod:`endpointd.secrets.store`: which credentials exist and where each is kept: the OS
  keyring, or :mod:`endpointd.secrets.file_store` (0600 files) on machines without one.
* :mod:`endpointd.secrets.proxy`: the per-command proxy that adds an http-delivered
  credential's header at egress, for the credential's hosts only.
* :mod:`endpointd.secrets.ca`: the device CA whose leaf certificates that proxy shows.
* :mod:`endpointd.secrets.peer`: whether a local client is one of the command's processes.
* :func:`own_secrets` (here): the daemon's own secrets the redactor masks besides the stored
  credentials: the device's private key (and its CA's, once loaded), and the values of the
  daemon's environment variables whose names say they are secret.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Mapping

from endpointd.config import KeyConfig

__all__ = ["environment_secrets", "own_secrets", "secret_looking"]

# Names (upper-cased) whose values are secret: tokens, passwords, API and private keys.
_SECRET_NAME = re.compile(
    r"TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|API_?KEY|PRIVATE_?KEY|ACCESS_?KEY"
    r"|_KEY\Z|\AKEY\Z|_PAT\Z|COOKIE|SESSION_?ID|_DSN\Z"
)
# ... unless they name where a secret is, not the secret.
_LOCATION_NAME = re.compile(r"_(FILE|PATH|DIR|SOCK|SOCKET)\Z")
MIN_SECRET_CHARS = 8
# A device key that could not be read is tried again after this long.
_KEY_RETRY_SECONDS = 60.0

_key_cache: dict[KeyConfig, tuple[bytes | None, float]] = {}
_key_lock = threading.Lock()


def secret_looking(name: str) -> bool:
    """Whether an environment variable's name says its value is a secret."""
    upper = name.upper()
    return bool(_SECRET_NAME.search(upper)) and not _LOCATION_NAME.search(upper)


def environment_secrets(environ: Mapping[str, str]) -> dict[str, bytes]:
    """The values (8 characters or more) of the secret-looking variables of ``environ``."""
    found: dict[str, bytes] = {}
    for name, value in environ.items():
        if secret_looking(name) and len(value.strip()) >= MIN_SECRET_CHARS:
            found[f"endpointd:env:{name}"] = os.fsencode(value)
    return found


def device_key_seed(where: KeyConfig) -> bytes | None:
    """The device's raw 32-byte Ed25519 private key, if it can be read (cached).

    The redactor masks it with its encodings: the keyring keeps it base64-encoded, and a
    key file's PEM body is the base64 of a DER prefix plus these bytes (both are among the
    shifted base64 forms :class:`endpointd.secrets.redact.Redactor` masks).
    """
    with _key_lock:
        cached = _key_cache.get(where)
        now = time.monotonic()
        if cached is not None and (cached[0] is not None or now < cached[1]):
            return cached[0]
        seed: bytes | None = None
        try:
            from endpointd.keys import load_key

            seed = load_key(where)._raw_private()
        except Exception:  # any storage trouble: nothing to mask, try again later
            seed = None
        _key_cache[where] = (seed, now + _KEY_RETRY_SECONDS)
        return seed


def own_secrets(
    key: KeyConfig | None, environ: Mapping[str, str] | None = None
) -> dict[str, bytes]:
    """What the redactor masks besides the stored credentials (names are labels only)."""
    found = environment_secrets(os.environ if environ is None else environ)
    if key is not None:
        seed = device_key_seed(key)
        if seed is not None:
            found["endpointd:device-key"] = seed
    from endpointd.secrets.ca import loaded_keys

    for index, pem in enumerate(loaded_keys()):
        found[f"endpointd:device-ca:{index}"] = pem
    return found
