"""ingest routes, ticket inboxes, leases and router decisions

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 01:43:47.624294
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "pause",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column(
            "paused_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.Column("paused_by", sa.String(length=200), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.CheckConstraint("id = 1", name=op.f("ck_pause_single_row")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pause")),
    )
    op.add_column("llm_calls", sa.Column("prompt_version_id", sa.String(length=16), nullable=True))
    op.add_column("llm_calls", sa.Column("policy_version_id", sa.String(length=16), nullable=True))
    op.create_foreign_key(
        op.f("fk_llm_calls_prompt_version_id_prompt_versions"),
        "llm_calls",
        "prompt_versions",
        ["prompt_version_id"],
        ["id"],
    )
    op.create_foreign_key(
        op.f("fk_llm_calls_policy_version_id_policy_versions"),
        "llm_calls",
        "policy_versions",
        ["policy_version_id"],
        ["id"],
    )
    op.create_table(
        "router_decisions",
        sa.Column("id", sa.String(length=16), nullable=False),
        sa.Column("session_id", sa.String(length=16), nullable=True),
        sa.Column("llm_call_id", sa.String(length=16), nullable=True),
        sa.Column("tool", sa.String(length=50), nullable=False),
        sa.Column("arguments", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("trigger_ids", postgresql.ARRAY(sa.String(length=16)), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column("ok", sa.Boolean(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["llm_call_id"],
            ["llm_calls.id"],
            name=op.f("fk_router_decisions_llm_call_id_llm_calls"),
        ),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name=op.f("fk_router_decisions_session_id_sessions")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_router_decisions")),
    )
    op.create_index(
        op.f("ix_router_decisions_created_at"), "router_decisions", ["created_at"], unique=False
    )
    op.create_index(
        op.f("ix_router_decisions_trigger_ids"),
        "router_decisions",
        ["trigger_ids"],
        unique=False,
        postgresql_using="gin",
    )
    op.create_table(
        "leases",
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("holder", sa.String(length=200), nullable=False),
        sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("renewed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_leases")),
    )
    op.create_table(
        "ticket_inbox",
        sa.Column("ticket_id", sa.String(length=16), nullable=False),
        sa.Column("trigger_id", sa.String(length=16), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("read_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("handed_back_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["ticket_id"], ["tickets.id"], name=op.f("fk_ticket_inbox_ticket_id_tickets")
        ),
        sa.ForeignKeyConstraint(
            ["trigger_id"], ["triggers.id"], name=op.f("fk_ticket_inbox_trigger_id_triggers")
        ),
        sa.PrimaryKeyConstraint("ticket_id", "trigger_id", name=op.f("pk_ticket_inbox")),
    )
    op.create_index(
        op.f("ix_ticket_inbox_trigger_id"), "ticket_inbox", ["trigger_id"], unique=False
    )
    op.create_index(
        "ix_ticket_inbox_unread",
        "ticket_inbox",
        ["ticket_id", "created_at"],
        unique=False,
        postgresql_where=sa.text("read_at IS NULL AND handed_back_at IS NULL"),
    )
    op.add_column("triggers", sa.Column("route", sa.String(length=20), nullable=True))
    op.add_column("triggers", sa.Column("digested_at", sa.DateTime(timezone=True), nullable=True))
    op.create_check_constraint(
        op.f("ck_triggers_route"), "triggers", "route IN ('router', 'subscribers', 'dropped')"
    )
    op.create_index(
        "ix_triggers_undigested",
        "triggers",
        ["created_at"],
        unique=False,
        postgresql_where=sa.text("route = 'subscribers' AND digested_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_table("pause")
    op.drop_constraint(
        op.f("fk_llm_calls_policy_version_id_policy_versions"), "llm_calls", type_="foreignkey"
    )
    op.drop_constraint(
        op.f("fk_llm_calls_prompt_version_id_prompt_versions"), "llm_calls", type_="foreignkey"
    )
    op.drop_column("llm_calls", "policy_version_id")
    op.drop_column("llm_calls", "prompt_version_id")
    op.drop_table("router_decisions")
    op.drop_table("leases")
    op.drop_index(
        "ix_triggers_undigested",
        table_name="triggers",
        postgresql_where=sa.text("route = 'subscribers' AND digested_at IS NULL"),
    )
    op.drop_constraint(op.f("ck_triggers_route"), "triggers", type_="check")
    op.drop_column("triggers", "digested_at")
    op.drop_column("triggers", "route")
    op.drop_index(
        "ix_ticket_inbox_unread",
        table_name="ticket_inbox",
        postgresql_where=sa.text("read_at IS NULL AND handed_back_at IS NULL"),
    )
    op.drop_index(op.f("ix_ticket_inbox_trigger_id"), table_name="ticket_inbox")
    op.drop_table("ticket_inbox")
