"""commands wait for local approval

A device whose local policy says `ask` holds a command until a human there decides, and
tells the gateway (AwaitingApproval): the command's state becomes `awaiting_approval`, with
the policy rule and the device's deadline kept in two new columns.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30 03:50:26.152057
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out rather than imported from the models: a migration must not change when they do.
_OLD_STATES = (
    "'queued', 'delivered', 'running', 'finished', 'failed', 'cancelled', 'expired', 'refused'"
)
_NEW_STATES = (
    "'queued', 'delivered', 'awaiting_approval', 'running', 'finished', 'failed', "
    "'cancelled', 'expired', 'refused'"
)


def upgrade() -> None:
    op.add_column("commands", sa.Column("approval_rule", sa.Text(), nullable=True))
    op.add_column(
        "commands", sa.Column("approval_deadline", sa.DateTime(timezone=True), nullable=True)
    )
    # Autogenerate does not compare check constraints: this part is by hand.
    op.drop_constraint(op.f("ck_commands_state"), "commands", type_="check")
    op.create_check_constraint(op.f("ck_commands_state"), "commands", f"state IN ({_NEW_STATES})")


def downgrade() -> None:
    # The device accepted these; `running` is what the old schema called that.
    op.execute("UPDATE commands SET state = 'running' WHERE state = 'awaiting_approval'")
    op.drop_constraint(op.f("ck_commands_state"), "commands", type_="check")
    op.create_check_constraint(op.f("ck_commands_state"), "commands", f"state IN ({_OLD_STATES})")
    op.drop_column("commands", "approval_deadline")
    op.drop_column("commands", "approval_rule")
