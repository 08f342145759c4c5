"""devices report their repositories

``device_repositories`` holds the git clones a device last reported under its allowed roots
(``RepositoryReport``): each report replaces the device's previous rows. ``owner_name`` is
the ``owner/name`` of the clone's remote, lower case (NULL when it has none a repository
could be named by); the control plane routes a ticket for ``owner/name`` to a device that
has it. ``devices.repositories_reported_at`` is when the last report arrived (NULL: never,
e.g. a daemon older than the report), ``repositories_truncated`` whether the device's scan
stopped at its bounds.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-02 13:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "devices",
        sa.Column("repositories_reported_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.add_column("devices", sa.Column("repositories_truncated", sa.Boolean(), nullable=True))
    op.create_table(
        "device_repositories",
        sa.Column("device_id", sa.String(length=16), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("remote", sa.Text(), nullable=True),
        sa.Column("owner_name", sa.Text(), nullable=True),
        sa.Column("default_branch", sa.Text(), nullable=True),
        sa.Column(
            "reported_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["device_id"],
            ["devices.id"],
            name=op.f("fk_device_repositories_device_id_devices"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("device_id", "path", name=op.f("pk_device_repositories")),
    )
    op.create_index(
        "ix_device_repositories_owner_name",
        "device_repositories",
        ["owner_name"],
        unique=False,
        postgresql_where=sa.text("owner_name IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_device_repositories_owner_name", table_name="device_repositories")
    op.drop_table("device_repositories")
    op.drop_column("devices", "repositories_truncated")
    op.drop_column("devices", "repositories_reported_at")
