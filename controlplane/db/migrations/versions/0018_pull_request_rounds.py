"""tickets count the rounds their pull request's bots and CI start

A ticket waiting in ``ready`` (its pull request open) is woken by what happens on the
pull request. Rounds nobody asked for are capped per ticket
(``controlplane.tickets.pr_rounds``): ``ci_fix_rounds`` counts the rounds a failed CI
result started, ``bot_rounds`` those bot events started, both since ``loop_since``, the
last event from a person on the ticket's threads (or a person waking it after a block).
A person's event starts both counts over.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-02 12:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "tickets",
        sa.Column("ci_fix_rounds", sa.Integer(), server_default=sa.text("0"), nullable=False),
    )
    op.add_column(
        "tickets",
        sa.Column("bot_rounds", sa.Integer(), server_default=sa.text("0"), nullable=False),
    )
    op.add_column("tickets", sa.Column("loop_since", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("tickets", "loop_since")
    op.drop_column("tickets", "bot_rounds")
    op.drop_column("tickets", "ci_fix_rounds")
