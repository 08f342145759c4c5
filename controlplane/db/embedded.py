"""The embedded Postgres of ``superagent up``: the ``pgserver`` wheel, data in the state dir.

It listens on a Unix socket only, so nothing outside this machine can reach it. The server
is stopped when the last process that opened it exits.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

from controlplane.errors import ConfigError

log = logging.getLogger(__name__)


class EmbeddedPostgres:
    def __init__(self, state_dir: Path) -> None:
        self.data_dir = state_dir / "postgres"
        self._server: Any = None

    def start(self) -> str:
        """Start (or join) the server and return its ``postgresql://`` URL."""
        # pgserver warns about XDG_RUNTIME_DIR on servers without a login session; harmless.
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
        try:
            from pgserver.postgres_server import get_server
        except ImportError as exc:  # pragma: no cover - pgserver is a hard dependency
            raise ConfigError(
                "the embedded database needs the pgserver wheel (pip install pgserver), "
                "or set DATABASE_URL to a Postgres server"
            ) from exc
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        log.info("starting embedded Postgres in %s", self.data_dir)
        try:
            self._server = get_server(self.data_dir, cleanup_mode="stop")
        except Exception as exc:
            raise ConfigError(
                f"the embedded Postgres in {self.data_dir} did not start ({exc}); see "
                f"{self.data_dir / 'log'} or set DATABASE_URL to another server"
            ) from exc
        uri = self._server.get_uri()
        assert isinstance(uri, str)
        return uri

    def stop(self) -> None:
        if self._server is not None:
            self._server.cleanup()
            self._server = None
