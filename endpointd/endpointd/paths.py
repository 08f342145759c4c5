"""Where endpointd keeps its files, following each platform's conventions.

Computed from explicit inputs (environment, platform, home) so the rules can be tested for
every platform from any platform, and so callers never guess at a different location.
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


@dataclass(frozen=True)
class ConfigDir:
    """The config directory and which rule chose it (shown by `endpointd info`)."""

    path: Path
    source: str


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

    override = env.get(CONFIG_DIR_ENV)
    if override:
        # Made absolute now so the daemon's files do not move if its cwd changes later.
        return ConfigDir(Path(os.path.abspath(os.path.expanduser(override))), CONFIG_DIR_ENV)

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
