"""The admin token: configured, or generated once for a server that listens on loopback.

Every HTTP surface of the control plane needs the admin token, or a session made from it
(:mod:`controlplane.access.middleware`). Nothing is trusted for being "local": a reverse proxy
makes every peer look like 127.0.0.1, and on a shared machine every local user is a
loopback peer. So, as notebook servers do, a server started without
``SUPERAGENT_ADMIN_TOKEN`` generates one, keeps it in ``<state dir>/admin-token`` (mode
0600, readable by this user only), and prints a one-time sign-in link; the local CLI
(``superagent say``) reads the same file. A server that listens beyond loopback must be
given a token: it refuses to start without one.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import secrets
import stat
from pathlib import Path

from pydantic import SecretStr

from controlplane.errors import ConfigError
from controlplane.settings import Settings

log = logging.getLogger(__name__)

TOKEN_FILE = "admin-token"  # noqa: S105 - a file name, not a secret
GENERATED_BYTES = 32  # 43 URL-safe characters


def loopback_host(host: str) -> bool:
    """Whether listening on ``host`` keeps the server on this machine (127/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def token_path(settings: Settings) -> Path:
    return settings.state_dir / TOKEN_FILE


def for_server(settings: Settings) -> Settings:
    """The settings a server runs with: the configured token, or the generated one.

    Raises ConfigError, naming what to set, for a non-loopback bind without a token.
    """
    if settings.admin_token is not None:
        return settings
    if not loopback_host(settings.http.host):
        raise ConfigError(
            f"SUPERAGENT_HTTP__HOST={settings.http.host} listens beyond this machine, so "
            "SUPERAGENT_ADMIN_TOKEN must be set (32+ random characters: `openssl rand -hex 32`)"
        )
    token = _load_or_create(token_path(settings))
    return settings.model_copy(update={"admin_token": SecretStr(token)})


def for_client(settings: Settings) -> str | None:
    """The token a local CLI sends: the configured one, else the server's generated file."""
    if settings.admin_token is not None:
        return settings.admin_token.get_secret_value()
    try:
        return _read(token_path(settings))
    except (OSError, ConfigError):
        return None


def _read(path: Path) -> str:
    info = path.stat()
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"{path} is readable by other users; delete it and start again")
    token = path.read_text(encoding="ascii").strip()
    if len(token) < 32:
        raise ConfigError(f"{path} does not hold a token; delete it and start again")
    return token


def _load_or_create(path: Path) -> str:
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    except ConfigError as exc:
        # Others may have read it: a new token is the only safe answer.
        log.warning("%s; generating a new admin token", exc.message)
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    token = secrets.token_urlsafe(GENERATED_BYTES)
    # O_EXCL with the mode at creation: the file is never readable by others, not even
    # for an instant, and two servers starting at once cannot write two tokens.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return _read(path)
    with os.fdopen(fd, "w", encoding="ascii") as out:
        out.write(token + "\n")
    log.info("generated an admin token in %s", path)
    return token
