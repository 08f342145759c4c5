"""Where endpointd keeps its files, following each platform's conventions.

Computed from explicit inputs (environment, platform, home) so the rules can be tested for
every platform from any platform, and so callers never guess at a different location.

Two directories:

* the **config dir** holds what pairing wrote (``config.json``, an optional key file the
  user chose to put there, the future ``policy.toml``): small, precious, backed up;
* the **state dir** holds what the daemon produces while running (the command journal,
  output spools, ``status.json``, the single-instance lock): disposable between pairings,
  possibly large, never synced;
* the **data dir** holds the tickets' workspaces (``workspaces/<ticket>``, git worktrees of
  the user's clones). Commands work in there, so it is apart from the config and state
  dirs, which every command is denied.
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
DATA_DIR_ENV = "ENDPOINTD_DATA_DIR"


@dataclass(frozen=True)
class ConfigDir:
    """A directory and which rule chose it (shown by `endpointd info`)."""

    path: Path
    source: str


# The state and data dirs have the same shape; the aliases keep call sites readable.
StateDir = ConfigDir
DataDir = ConfigDir


def _override(env: Mapping[str, str], name: str) -> ConfigDir | None:
    value = env.get(name)
    if not value:
        return None
    # Made absolute now so the daemon's files do not move if its cwd changes later.
    return ConfigDir(Path(os.path.abspath(os.path.expanduser(value))), name)


@dataclass(frozen=True)
class _Convention:
    """Where one of the directories goes on each platform, below the home directory
    unless a variable says otherwise."""

    override: str  # ENDPOINTD_*_DIR
    windows_var: str  # %APPDATA% or %LOCALAPPDATA%
    windows_default: tuple[str, ...]  # that variable's standard value, below home
    windows_name: str
    macos: tuple[str, ...]  # below home
    xdg_var: str
    xdg_default: tuple[str, ...]  # below home


def _resolve(
    rule: _Convention,
    env: Mapping[str, str] | None,
    platform: str | None,
    home: Path | None,
) -> ConfigDir:
    env = os.environ if env is None else env
    platform = sys.platform if platform is None else platform
    home = Path.home() if home is None else home

    override = _override(env, rule.override)
    if override:
        return override

    if platform == "win32":
        base = env.get(rule.windows_var)
        if base:
            return ConfigDir(Path(base) / rule.windows_name, f"%{rule.windows_var}%")
        # The variable is missing only in stripped-down service environments; this is its
        # standard value.
        return ConfigDir(home.joinpath(*rule.windows_default, rule.windows_name), "Windows default")

    if platform == "darwin":
        return ConfigDir(home.joinpath(*rule.macos), "macOS default")

    xdg = env.get(rule.xdg_var)
    # The XDG spec says a relative value is invalid and must be ignored.
    if xdg and os.path.isabs(xdg):
        return ConfigDir(Path(xdg) / APP_NAME, f"${rule.xdg_var}")
    return ConfigDir(home.joinpath(*rule.xdg_default, APP_NAME), "XDG default")


_SUPPORT = ("Library", "Application Support")
_CONFIG = _Convention(
    CONFIG_DIR_ENV,
    "APPDATA",
    ("AppData", "Roaming"),
    APP_NAME,
    (*_SUPPORT, APP_NAME),
    "XDG_CONFIG_HOME",
    (".config",),
)
_STATE = _Convention(
    STATE_DIR_ENV,
    "LOCALAPPDATA",
    ("AppData", "Local"),
    APP_NAME,
    # Apple has no separate state location; a subfolder keeps it apart from the config.
    (*_SUPPORT, APP_NAME, "state"),
    "XDG_STATE_HOME",
    (".local", "state"),
)
# On macOS and Windows the usual place is beside or inside the config and state dirs,
# which every command is denied: the data dir, where commands work, is a sibling of its own.
_DATA = _Convention(
    DATA_DIR_ENV,
    "LOCALAPPDATA",
    ("AppData", "Local"),
    f"{APP_NAME}-data",
    (*_SUPPORT, f"{APP_NAME}-data"),
    "XDG_DATA_HOME",
    (".local", "share"),
)


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
    return _resolve(_CONFIG, env, platform, home)


def state_dir(
    env: Mapping[str, str] | None = None,
    platform: str | None = None,
    home: Path | None = None,
) -> StateDir:
    """Return endpointd's state directory (journal, spools, status); nothing is created.

    $ENDPOINTD_STATE_DIR if set; else %LOCALAPPDATA%\\endpointd on Windows (machine-local,
    unlike the roaming config), ~/Library/Application Support/endpointd/state on macOS,
    and $XDG_STATE_HOME/endpointd (default ~/.local/state/endpointd) on Linux and other Unix.
    """
    return _resolve(_STATE, env, platform, home)


def data_dir(
    env: Mapping[str, str] | None = None,
    platform: str | None = None,
    home: Path | None = None,
) -> DataDir:
    """Return endpointd's data directory (the tickets' workspaces); nothing is created.

    $ENDPOINTD_DATA_DIR if set; else $XDG_DATA_HOME/endpointd (default
    ~/.local/share/endpointd) on Linux and other Unix,
    ~/Library/Application Support/endpointd-data on macOS and
    %LOCALAPPDATA%\\endpointd-data on Windows.
    """
    return _resolve(_DATA, env, platform, home)


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) if needed and make it 0700: it holds keys and output."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if os.name == "posix":
        os.chmod(path, 0o700)
    return path
