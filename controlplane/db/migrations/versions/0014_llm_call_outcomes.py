"""llm_calls: the outcome class of every model call

``llm_calls.outcome`` is what came of the call: ``ok``, ``transient``, ``context``,
``permanent`` or ``malformed`` (:mod:`controlplane.llm.errors`). Rows written before it have
no class on record; the failed ones become ``transient``, which is how the code of their
time treated every failure (it retried them).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01 22:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "llm_calls",
        sa.Column("outcome", sa.String(length=20), server_default="ok", nullable=False),
    )
    op.execute("UPDATE llm_calls SET outcome = 'transient' WHERE error IS NOT NULL")
    op.create_check_constraint(
        op.f("ck_llm_calls_outcome"),
        "llm_calls",
        "outcome IN ('ok', 'transient', 'context', 'permanent', 'malformed')",
    )


def downgrade() -> None:
    op.drop_constraint(op.f("ck_llm_calls_outcome"), "llm_calls", type_="check")
    op.drop_column("llm_calls", "outcome")
