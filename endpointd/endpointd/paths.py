"""Where endpointd keeps its files, following each platform's conventions.

Computed from explicit inputs (environment, platform, home) so the rules can be tested for
every platform from any platform, and so callers never guess at a different location.

Two directories:

* the **config dir** holds what pairing wrote (``config.json``, an optional key file the
  user chose to put there, the future ``policy.toml``): small, precious, backed up;
* the **state dir** holds what the daemon produces while running (the command journal,
  output spools, ``status.json``, the single-instance lock): disposable between pairings,
  possibly large, never synced.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

APP_NAME = "endpointd"
# An explicit override wins over every convention: tests, containers, and people running
# two daemons on one machine (e.g. the control plane's embedded endpointd) need it.
CONFIG_DIR_ENV = "ENDPOINTD_CONFIG_DIR"
STATE_DIR_ENV = "ENDPOINTD_STATE_DIR"


@dataclass(frozen=True)
class ConfigDir:
    """A directory and which rule chose it (shown by `endpointd info`)."""

    path: Path
    source: str


# The state dir has the same shape; the alias keeps call sites readable.
StateDir = ConfigDir


def _override(env: Mapping[str, str], name: str) -> ConfigDir | None:
    value = env.get(name)
    if not value:
        return None
    # Made absolute now so the daemon's files do not move if its cwd changes later.
    return ConfigDir(Path(os.path.abspath(os.path.expanduser(value))), name)


def config_dir(
    env: Mapping[str, str] | None = None,
    platform: str | None = None,
    home: Path | None = None,
) -> ConfigDir:
    """Return endpointd's config directory; nothing is created.

    $ENDPOINTD_CONFIG_DIR if set; else %APPDATA%\\endpointd on Windows,
    ~/Library/Application Support/endpointd on macOS, and $XDG_CONFIG_HOME/endpointd
    (default ~/.config/endpointd) on Linux and other Unix systems.
    """
    env = os.environ if env is None else env
    platform = sys.platform if platform is None else platform
    home = Path.home() if home is None else home

    override = _override(env, CONFIG_DIR_ENV)
    if override:
        return override

    if platform == "win32":
        appdata = env.get("APPDATA")
        if appdata:
            return ConfigDir(Path(appdata) / APP_NAME, "%APPDATA%")
        # APPDATA is missing only in stripped-down service environments; this is its
        # standard value.
        return ConfigDir(home / "AppData" / "Roaming" / APP_NAME, "Windows default")

    if platform == "darwin":
        return ConfigDir(home / "Library" / "Application Support" / APP_NAME, "macOS default")

    xdg = env.get("XDG_CONFIG_HOME")
    # The XDG spec says a relative value is invalid and must be ignored.
    if xdg and os.path.isabs(xdg):
        return ConfigDir(Path(xdg) / APP_NAME, "$XDG_CONFIG_HOME")
    return ConfigDir(home / ".config" / APP_NAME, "XDG default")


def state_dir(
    env: Mapping[str, str] | None = None,
    platform: str | None = None,
    home: Path | None = None,
) -> StateDir:
    """Return endpointd's state directory (journal, spools, status); nothing is created.

    $ENDPOINTD_STATE_DIR if set; else %LOCALAPPDATA%\\endpointd on Windows (machine-local,
    unlike the roaming config), ~/Library/Application Support/endpointd/state on macOS
    (Apple has no separate state location; a subfolder keeps it apart from the config), and
    $XDG_STATE_HOME/endpointd (default ~/.local/state/endpointd) on Linux and other Unix.
    """
    env = os.environ if env is None else env
    platform = sys.platform if platform is None else platform
    home = Path.home() if home is None else home

    override = _override(env, STATE_DIR_ENV)
    if override:
        return override

    if platform == "win32":
        local = env.get("LOCALAPPDATA")
        if local:
            return StateDir(Path(local) / APP_NAME, "%LOCALAPPDATA%")
        return StateDir(home / "AppData" / "Local" / APP_NAME, "Windows default")

    if platform == "darwin":
        return StateDir(
            home / "Library" / "Application Support" / APP_NAME / "state", "macOS default"
        )

    xdg = env.get("XDG_STATE_HOME")
    if xdg and os.path.isabs(xdg):
        return StateDir(Path(xdg) / APP_NAME, "$XDG_STATE_HOME")
    return StateDir(home / ".local" / "state" / APP_NAME, "XDG default")


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) if needed and make it 0700: it holds keys and output."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if os.name == "posix":
        os.chmod(path, 0o700)
    return path
