"""The policy error: the file cannot be used, and the message says where and why."""

from __future__ import annotations

from pathlib import Path

from endpointd.errors import ConfigError


class PolicyError(ConfigError):
    """The policy file cannot be used; the message names the file, line and key."""

    def __init__(self, path: Path, message: str, line: int | None = None) -> None:
        self.path = path
        self.line = line
        where = f"{path}:{line}" if line else str(path)
        super().__init__(f"{where}: {message}")
