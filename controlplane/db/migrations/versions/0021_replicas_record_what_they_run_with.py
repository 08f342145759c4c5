"""replicas record what they run with

``replicas.runs_with`` is what each replica runs with, secrets excluded (its pid, the
router's and workers' models or none, the model endpoint's host, the enabled channels),
written with its heartbeat, so ``superagent status`` describes the deployment rather than
the shell it is typed in. Rows of replicas older than this release hold ``{}``.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-02 16:40:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "replicas",
        sa.Column(
            "runs_with",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'"),
            nullable=False,
        ),
    )


def downgrade() -> None:
    op.drop_column("replicas", "runs_with")
