"""The paired device's configuration: ``<config dir>/config.json``.

Written once by `endpointd pair`, read by every other command, deleted by `unpair`. It is
plain JSON (0600, in a 0700 directory) so a user can read what the daemon trusts. The wire
protocol never sees this shape; :func:`load_config` and :func:`save_config` are the only
places it is converted.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from endpointd.errors import ConfigError
from endpointd.fsutil import atomic_write
from endpointd.paths import config_dir, ensure_private_dir

CONFIG_FILE = "config.json"
CONFIG_VERSION = 1

TrustMode = Literal["pinned", "system", "plaintext"]
KeyStorage = Literal["keyring", "file"]


@dataclass(frozen=True)
class TrustConfig:
    """How the daemon authenticates the server on every connect.

    * ``pinned``: the server's private CA (``ca_pem``) is the only trust root, and the leaf
      is verified for the fixed name ``superagent-gateway``; renewal by the same CA is fine.
    * ``system``: the certificate chains to a public CA (e.g. a TLS-terminating proxy);
      normal verification against the host name in ``server_url``.
    * ``plaintext``: ``http://`` to a loopback address only (tests, the embedded daemon).
    """

    mode: TrustMode
    ca_pem: str = ""
    # Hex SHA-256 of the leaf seen at pairing; informational after pairing (the CA is the
    # pin, so the leaf may be renewed), shown by `endpointd status`.
    leaf_sha256: str = ""


@dataclass(frozen=True)
class KeyConfig:
    """Where the device's Ed25519 private key lives."""

    storage: KeyStorage
    # keyring: the service and user name of the entry; file: the absolute path.
    service: str = ""
    username: str = ""
    path: str = ""


@dataclass(frozen=True)
class DeviceConfig:
    server_url: str
    device_id: str
    device_name: str
    server_name: str
    trust: TrustConfig
    key: KeyConfig
    # Hex of the raw 32-byte public key, so a swapped key file is detected before connecting.
    public_key: str
    paired_at: str
    # Wall-clock cap for a command whose timeout_seconds is 0 (the future policy file's
    # max runtime takes precedence when it exists).
    default_timeout_seconds: int = 3600
    version: int = field(default=CONFIG_VERSION)


def config_path(directory: Path | None = None) -> Path:
    return (directory or config_dir().path) / CONFIG_FILE


def save_config(config: DeviceConfig, directory: Path | None = None) -> Path:
    directory = directory or config_dir().path
    ensure_private_dir(directory)
    path = directory / CONFIG_FILE
    atomic_write(path, (json.dumps(asdict(config), indent=2) + "\n").encode(), mode=0o600)
    return path


def load_config(directory: Path | None = None) -> DeviceConfig:
    """The paired configuration, or ConfigError saying how to pair."""
    path = config_path(directory)
    try:
        raw: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"not paired (no {path}); run `endpointd pair URL CODE` first") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    try:
        if raw.get("version") != CONFIG_VERSION:
            raise ValueError(f"unsupported config version {raw.get('version')!r}")
        return DeviceConfig(
            **{
                **raw,
                "trust": TrustConfig(**raw["trust"]),
                "key": KeyConfig(**raw["key"]),
            }
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{path} is malformed ({exc}); re-pair with `endpointd pair`") from None


def delete_config(directory: Path | None = None) -> bool:
    path = config_path(directory)
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True
