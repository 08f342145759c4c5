"""harness workers

A ticket may be worked by a coding-agent CLI on its device (a *harness*: Qwen Code, Codex
CLI, Claude Code) instead of the built-in worker.

* ``devices.harnesses``: the harnesses the device last reported with its repositories, as
  JSON (``[{"name", "version", "allowed", "logged_in"}]``; NULL: never reported, a daemon
  older than harnesses), and ``devices.default_harness``, its policy's default ('' none).
* ``commands.kind`` may be ``run_harness``.
* ``tickets.harness``: the ticket's worker backend (``builtin`` or a harness's name) once
  chosen: by the router when a person asked for one, else at the ticket's first round.
* ``harness_runs``: each run of a harness for a ticket, the device command that ran it, the
  harness's own session id (what a follow-up resumes), when its first and last events came,
  and what it reported using. ``events`` counts the events already recorded in the
  ticket's session, so a replica taking the round over records each event once.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-02 21:10:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD_KINDS = (
    "kind IN ('exec', 'read_file', 'write_file', 'list_dir', 'cancel', "
    "'prepare_workspace', 'release_workspace', 'search', 'glob')"
)
_NEW_KINDS = (
    "kind IN ('exec', 'read_file', 'write_file', 'list_dir', 'cancel', "
    "'prepare_workspace', 'release_workspace', 'search', 'glob', 'run_harness')"
)


def upgrade() -> None:
    op.drop_constraint(op.f("ck_commands_kind"), "commands", type_="check")
    op.create_check_constraint(op.f("ck_commands_kind"), "commands", _NEW_KINDS)
    op.add_column(
        "devices",
        sa.Column("harnesses", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    )
    op.add_column("devices", sa.Column("default_harness", sa.String(length=30), nullable=True))
    op.add_column("tickets", sa.Column("harness", sa.String(length=30), nullable=True))
    op.create_table(
        "harness_runs",
        sa.Column("id", sa.String(length=16), nullable=False),
        sa.Column("ticket_id", sa.String(length=16), nullable=False),
        sa.Column("assignment_id", sa.String(length=16), nullable=True),
        sa.Column("command_id", sa.String(length=16), nullable=False),
        sa.Column("harness", sa.String(length=30), nullable=False),
        sa.Column("session_id", sa.Text(), nullable=True),
        sa.Column("resumed", sa.Text(), nullable=True),
        sa.Column("events", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("turns", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column(
            "completion_tokens", sa.BigInteger(), server_default=sa.text("0"), nullable=False
        ),
        sa.Column("cost_usd", sa.Numeric(precision=12, scale=6), nullable=True),
        sa.Column("outcome", sa.Text(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("first_event_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_event_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["ticket_id"], ["tickets.id"], name=op.f("fk_harness_runs_ticket_id_tickets")
        ),
        sa.ForeignKeyConstraint(
            ["assignment_id"],
            ["assignments.id"],
            name=op.f("fk_harness_runs_assignment_id_assignments"),
        ),
        sa.ForeignKeyConstraint(
            ["command_id"], ["commands.id"], name=op.f("fk_harness_runs_command_id_commands")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_harness_runs")),
    )
    op.create_index(op.f("ix_harness_runs_ticket_id"), "harness_runs", ["ticket_id"], unique=False)


def downgrade() -> None:
    op.execute("DELETE FROM harness_runs")
    op.execute("DELETE FROM commands WHERE kind = 'run_harness'")
    op.drop_constraint(op.f("ck_commands_kind"), "commands", type_="check")
    op.create_check_constraint(op.f("ck_commands_kind"), "commands", _OLD_KINDS)
    op.drop_index(op.f("ix_harness_runs_ticket_id"), table_name="harness_runs")
    op.drop_table("harness_runs")
    op.drop_column("tickets", "harness")
    op.drop_column("devices", "default_harness")
    op.drop_column("devices", "harnesses")
