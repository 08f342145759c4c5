"""api tokens

``api_tokens``: named tokens for the HTTP API, one per person or script (``superagent
tokens create``; ``superagent login`` keeps one in a context). The name is the audit
identity of what is done with it; only a SHA-256 of the secret is stored; a live name is
unique, a revoked token keeps its row (who had it, until when).

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-08 00:20:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.String(length=16), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("secret_hash", sa.LargeBinary(), nullable=False),
        sa.Column("created_by", sa.String(length=200), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_tokens")),
        sa.UniqueConstraint("secret_hash", name=op.f("uq_api_tokens_secret_hash")),
    )
    op.create_index(
        "uq_api_tokens_live_name",
        "api_tokens",
        ["name"],
        unique=True,
        postgresql_where=sa.text("revoked_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("uq_api_tokens_live_name", table_name="api_tokens")
    op.drop_table("api_tokens")
