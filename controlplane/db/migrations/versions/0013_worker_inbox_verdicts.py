"""access: worker inbox verdicts and held external actions

* ``triggers.allowlisted``: the actor is a human on the source's allowlist, whether or not
  the event addressed the agent; existing rows take it from their verdict (an explicit
  request is by an allowlisted human; older follow-ups stay false, the safe side).
* ``triggers.public``: whether the event was said in public (NULL: not known).
* ``tickets.untrusted_trigger_id`` / ``tickets.untrusted_public``: input without authority
  the ticket's worker read since its last input with authority, which holds its actions
  with effects outside the device until people confirm.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01 20:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "triggers",
        sa.Column("allowlisted", sa.Boolean(), server_default=sa.text("false"), nullable=False),
    )
    op.add_column("triggers", sa.Column("public", sa.Boolean(), nullable=True))
    op.execute("UPDATE triggers SET allowlisted = true WHERE verdict = 'explicit'")
    op.add_column("tickets", sa.Column("untrusted_trigger_id", sa.String(length=16), nullable=True))
    op.add_column(
        "tickets",
        sa.Column(
            "untrusted_public", sa.Boolean(), server_default=sa.text("false"), nullable=False
        ),
    )
    op.create_foreign_key(
        op.f("fk_tickets_untrusted_trigger_id_triggers"),
        "tickets",
        "triggers",
        ["untrusted_trigger_id"],
        ["id"],
    )


def downgrade() -> None:
    op.drop_constraint(
        op.f("fk_tickets_untrusted_trigger_id_triggers"), "tickets", type_="foreignkey"
    )
    op.drop_column("tickets", "untrusted_public")
    op.drop_column("tickets", "untrusted_trigger_id")
    op.drop_column("triggers", "public")
    op.drop_column("triggers", "allowlisted")
