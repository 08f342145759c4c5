"""quarantine: items that keep failing end with a reason, and every such failure is on record

* ``triggers.route_attempts``/``route_error``: router turns over a batch that held the
  trigger and failed for a reason other than an unreachable model. Past
  ``router.quarantine_after`` the trigger leaves the inbox ``undecidable_at`` with its
  reason (``superagent triggers retry`` puts it back).
* ``triggers.model_notice_at``: the thread was told, once, that the model is unreachable
  and this message waits.
* ``tickets.failed_rounds``/``retry_at``/``last_error``: consecutive rounds that failed,
  when the next may start (backoff), and why the last one failed. Past
  ``workers.failed_rounds_limit`` the ticket ends blocked.
* ``item_failures``: one row per item that failed (a router turn, a worker round, an
  effect, an event, a device message), with its class, counted in ``/metrics``.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02 00:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "triggers",
        sa.Column("route_attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
    )
    op.add_column("triggers", sa.Column("route_error", sa.Text(), nullable=True))
    op.add_column(
        "triggers", sa.Column("undecidable_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.add_column(
        "triggers", sa.Column("model_notice_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.create_index(
        "ix_triggers_undecidable",
        "triggers",
        ["undecidable_at"],
        unique=False,
        postgresql_where=sa.text("undecidable_at IS NOT NULL"),
    )
    op.add_column(
        "tickets",
        sa.Column("failed_rounds", sa.Integer(), server_default=sa.text("0"), nullable=False),
    )
    op.add_column("tickets", sa.Column("retry_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("tickets", sa.Column("last_error", sa.Text(), nullable=True))
    op.create_table(
        "item_failures",
        sa.Column("id", sa.String(length=16), nullable=False),
        sa.Column("loop", sa.String(length=30), nullable=False),
        sa.Column("item_id", sa.String(length=500), nullable=False),
        sa.Column("error_class", sa.String(length=20), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("quarantined", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "error_class IN ('transient', 'context', 'permanent', 'malformed', 'internal')",
            name=op.f("ck_item_failures_error_class"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_item_failures")),
    )
    op.create_index(
        op.f("ix_item_failures_created_at"), "item_failures", ["created_at"], unique=False
    )
    op.create_index(op.f("ix_item_failures_item_id"), "item_failures", ["item_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_item_failures_item_id"), table_name="item_failures")
    op.drop_index(op.f("ix_item_failures_created_at"), table_name="item_failures")
    op.drop_table("item_failures")
    op.drop_column("tickets", "last_error")
    op.drop_column("tickets", "retry_at")
    op.drop_column("tickets", "failed_rounds")
    op.drop_index("ix_triggers_undecidable", table_name="triggers")
    op.drop_column("triggers", "model_notice_at")
    op.drop_column("triggers", "undecidable_at")
    op.drop_column("triggers", "route_error")
    op.drop_column("triggers", "route_attempts")
