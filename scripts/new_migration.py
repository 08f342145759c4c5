"""Write a new Alembic revision from the difference between the models and the schema.

Usage: python scripts/new_migration.py "add widgets"

Starts a throwaway embedded Postgres, upgrades it to the current head, and lets Alembic
compare. Review the generated file before committing it.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from controlplane.db import migrate
from controlplane.db.embedded import EmbeddedPostgres


async def main(message: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        pg = EmbeddedPostgres(Path(tmp))
        url = pg.start()
        try:
            if any(p.name != "__init__.py" for p in (migrate.MIGRATIONS / "versions").glob("*.py")):
                await migrate.upgrade(url)
            await migrate.autogenerate(url, message)
        finally:
            pg.stop()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    asyncio.run(main(sys.argv[1]))
