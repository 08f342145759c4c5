"""Alembic environment: always driven programmatically by ``controlplane.db.migrate``.

The caller passes an open synchronous connection (from ``AsyncConnection.run_sync``), so
migrations run inside the caller's event loop and transaction.
"""

from __future__ import annotations

from alembic import context

from controlplane.db.models import Base

connection = context.config.attributes.get("connection")
if connection is None:
    raise SystemExit("run migrations with `superagent migrate`, not the alembic command")

context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    compare_type=True,
    transaction_per_migration=False,
)
with context.begin_transaction():
    context.run_migrations()
