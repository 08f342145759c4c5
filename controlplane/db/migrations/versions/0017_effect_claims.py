"""effects count every claim

``effects.claims`` counts every time a runner claimed the row, and is never reset.
``attempts`` is the failure budget: a new payload for the same key, a postponement and
``superagent effects revive`` all start it over, so "attempt 1" did not mean "never tried".
An effect with ``claims > 1`` may have run before without its completion being recorded
(a runner killed mid-send), so a reply looks for its marker before posting again.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-02 10:40:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Existing rows count their attempts as claims: at least that many happened.
    op.add_column(
        "effects", sa.Column("claims", sa.Integer(), server_default=sa.text("0"), nullable=False)
    )
    op.execute("UPDATE effects SET claims = attempts")


def downgrade() -> None:
    op.drop_column("effects", "claims")
