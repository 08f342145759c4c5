"""access: device owners, shares, shared groups and owner approvals

Work goes to a device only for its owner, for whom the owner shares it with, or with the
owner's approval (controlplane.authorization). Triggers keep the actor's groups (a device
may be shared with a group); a pairing code may name the group of a team device; tickets
record why their requester may use their device (device_grant). Shares, approvals and the
answers read for them are new tables.

Devices paired before this had no owner when none was given; they belong to the admin who
made their code (``web:admin``, the admin's web chat identity), so nobody else may direct
work to them until the admin shares them (``superagent devices share``). Owners written
as free text keep their value: a person's name matches that person (``superagent users
link``), ``SOURCE:ID`` that account.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 20:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_CREATED = dict(server_default=sa.text("now()"), nullable=False)


# Live tickets on a device their requester owns keep running: their grant is recorded as
# the router would have. Any other live ticket keeps no grant, so its next command on the
# device is refused (it was pointed there before anyone checked); rerouting it asks again.
_BACKFILL = """
WITH first AS (
    SELECT DISTINCT ON (m.ticket_id) m.ticket_id, m.initiator_name, m.trigger_id, m.person_id
    FROM mandates m ORDER BY m.ticket_id, m.created_at
), who AS (
    SELECT f.ticket_id, f.initiator_name,
           array_remove(ARRAY[
               p.name,
               CASE WHEN g.id IS NULL THEN NULL
                    WHEN g.actor_id LIKE lower(g.source) || ':%' THEN g.actor_id
                    ELSE lower(g.source) || ':' || g.actor_id END
           ], NULL) AS principals
    FROM first f
    LEFT JOIN triggers g ON g.id = f.trigger_id
    LEFT JOIN people p ON p.id = coalesce(g.person_id, f.person_id)
)
UPDATE tickets t SET device_grant = jsonb_build_object(
    'rule', 'owner', 'device_id', d.id, 'device', d.name, 'owner', d.owner,
    'matched', d.owner, 'requester', w.initiator_name, 'principals', to_jsonb(w.principals),
    'by', 'migration 0011', 'at', now())
FROM devices d, who w
WHERE t.device_id = d.id AND w.ticket_id = t.id AND t.device_grant IS NULL
  AND t.state NOT IN ('completed', 'failed', 'stopped') AND d.owner = ANY(w.principals)
"""


def upgrade() -> None:
    op.add_column(
        "triggers",
        sa.Column(
            "actor_groups",
            postgresql.ARRAY(sa.String(length=200)),
            server_default=sa.text("'{}'"),
            nullable=False,
        ),
    )
    op.create_index(
        "ix_triggers_approval_answers",
        "triggers",
        ["created_at"],
        unique=False,
        postgresql_where=sa.text("text LIKE '%apr\\_%'"),
    )
    op.add_column("pairing_codes", sa.Column("shared_with", sa.String(length=200), nullable=True))
    op.add_column(
        "tickets",
        sa.Column("device_grant", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    )
    op.create_table(
        "device_shares",
        sa.Column("device_id", sa.String(length=16), nullable=False),
        sa.Column("grantee", sa.String(length=200), nullable=False),
        sa.Column("created_by", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), **_CREATED),
        sa.ForeignKeyConstraint(
            ["device_id"],
            ["devices.id"],
            name=op.f("fk_device_shares_device_id_devices"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("device_id", "grantee", name=op.f("pk_device_shares")),
    )
    op.create_table(
        "device_approvals",
        sa.Column("id", sa.String(length=16), nullable=False),
        sa.Column("device_id", sa.String(length=16), nullable=False),
        sa.Column("ticket_id", sa.String(length=16), nullable=True),
        sa.Column("trigger_id", sa.String(length=16), nullable=True),
        sa.Column("thread_id", sa.String(length=16), nullable=True),
        sa.Column("owner", sa.String(length=200), nullable=False),
        sa.Column("requester", sa.String(length=200), nullable=False),
        sa.Column(
            "principals",
            postgresql.ARRAY(sa.String(length=200)),
            server_default=sa.text("'{}'"),
            nullable=False,
        ),
        sa.Column("what", sa.Text(), nullable=False),
        sa.Column("run", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("resume", sa.String(length=20), nullable=True),
        sa.Column("state", sa.String(length=20), server_default="pending", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), **_CREATED),
        sa.Column("asked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("decided_by", sa.String(length=200), nullable=True),
        sa.Column("decision_trigger_id", sa.String(length=16), nullable=True),
        sa.CheckConstraint(
            "state IN ('pending', 'approved', 'denied', 'expired', 'cancelled')",
            name=op.f("ck_device_approvals_state"),
        ),
        sa.ForeignKeyConstraint(
            ["device_id"], ["devices.id"], name=op.f("fk_device_approvals_device_id_devices")
        ),
        sa.ForeignKeyConstraint(
            ["ticket_id"], ["tickets.id"], name=op.f("fk_device_approvals_ticket_id_tickets")
        ),
        sa.ForeignKeyConstraint(
            ["trigger_id"], ["triggers.id"], name=op.f("fk_device_approvals_trigger_id_triggers")
        ),
        sa.ForeignKeyConstraint(
            ["thread_id"], ["threads.id"], name=op.f("fk_device_approvals_thread_id_threads")
        ),
        sa.ForeignKeyConstraint(
            ["decision_trigger_id"],
            ["triggers.id"],
            name=op.f("fk_device_approvals_decision_trigger_id_triggers"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_device_approvals")),
    )
    op.create_index(
        "ix_device_approvals_pending",
        "device_approvals",
        ["created_at"],
        unique=False,
        postgresql_where=sa.text("state = 'pending'"),
    )
    op.create_index(
        op.f("ix_device_approvals_ticket_id"), "device_approvals", ["ticket_id"], unique=False
    )
    op.create_table(
        "approval_answers",
        sa.Column("trigger_id", sa.String(length=16), nullable=False),
        sa.Column("approval_id", sa.String(length=16), nullable=False),
        sa.Column("verb", sa.String(length=10), nullable=False),
        sa.Column("outcome", sa.String(length=10), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), **_CREATED),
        sa.ForeignKeyConstraint(
            ["trigger_id"], ["triggers.id"], name=op.f("fk_approval_answers_trigger_id_triggers")
        ),
        sa.PrimaryKeyConstraint("trigger_id", "approval_id", name=op.f("pk_approval_answers")),
    )
    # Nobody named at pairing: the owner is whoever made the code, the admin so far.
    op.execute("UPDATE devices SET owner = 'web:admin' WHERE owner IS NULL OR owner = ''")
    op.execute("UPDATE pairing_codes SET owner = 'web:admin' WHERE owner IS NULL OR owner = ''")
    # A person's name is lower case (superagent users): an owner written "Alice" meant her.
    op.execute("UPDATE devices SET owner = lower(owner) WHERE owner NOT LIKE '%:%'")
    op.execute(_BACKFILL)


def downgrade() -> None:
    # Owners set to web:admin by the upgrade stay: an owner is never less safe than none.
    op.drop_table("approval_answers")
    op.drop_index(op.f("ix_device_approvals_ticket_id"), table_name="device_approvals")
    op.drop_index(
        "ix_device_approvals_pending",
        table_name="device_approvals",
        postgresql_where=sa.text("state = 'pending'"),
    )
    op.drop_table("device_approvals")
    op.drop_table("device_shares")
    op.drop_column("tickets", "device_grant")
    op.drop_column("pairing_codes", "shared_with")
    op.drop_index(
        "ix_triggers_approval_answers",
        table_name="triggers",
        postgresql_where=sa.text("text LIKE '%apr\\_%'"),
    )
    op.drop_column("triggers", "actor_groups")
