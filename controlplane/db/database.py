"""Which Postgres a process uses: ``DATABASE_URL``, or the embedded one."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from controlplane.db.embedded import EmbeddedPostgres
from controlplane.settings import Settings


@dataclass
class Database:
    url: str
    embedded: EmbeddedPostgres | None


@contextlib.contextmanager
def open_database(settings: Settings) -> Iterator[Database]:
    """The configured Postgres, or the embedded one started from the state directory."""
    if settings.database_url:
        yield Database(settings.database_url, None)
        return
    embedded = EmbeddedPostgres(settings.state_dir)
    url = embedded.start()
    try:
        yield Database(url, embedded)
    finally:
        embedded.stop()
