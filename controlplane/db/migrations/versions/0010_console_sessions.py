"""access: console sessions, one-time login links, sign-in throttle

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 20:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "console_sessions",
        sa.Column("secret_hash", sa.LargeBinary(), nullable=False),
        sa.Column("kind", sa.String(length=10), nullable=False),
        sa.Column("token_tag", sa.LargeBinary(), nullable=False),
        sa.Column("peer", sa.String(length=100), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("kind IN ('session', 'link')", name=op.f("ck_console_sessions_kind")),
        sa.PrimaryKeyConstraint("secret_hash", name=op.f("pk_console_sessions")),
    )
    op.create_index(
        op.f("ix_console_sessions_expires_at"), "console_sessions", ["expires_at"], unique=False
    )
    op.create_table(
        "signin_throttle",
        sa.Column("peer", sa.String(length=100), nullable=False),
        sa.Column("window_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("peer", name=op.f("pk_signin_throttle")),
    )


def downgrade() -> None:
    op.drop_table("signin_throttle")
    op.drop_index(op.f("ix_console_sessions_expires_at"), table_name="console_sessions")
    op.drop_table("console_sessions")
