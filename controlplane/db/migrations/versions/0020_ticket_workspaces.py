"""tickets know their workspace on the device

``tickets.workspace`` is the ticket's own working tree on its device (a git worktree under
endpointd's data dir, or a plain directory used in place), set once the device prepared it;
``workspace_base`` is where it was asked to start (``default_branch``, ``pull_request``,
``local_changes``); ``workspace_released_at`` is when the device was told the ticket ended,
so it may remove the workspace after its retention. ``commands.kind`` takes the new
operations of the device protocol: prepare_workspace, release_workspace, search, glob.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-02 14:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


_OLD_KINDS = "kind IN ('exec', 'read_file', 'write_file', 'list_dir', 'cancel')"
_NEW_KINDS = (
    "kind IN ('exec', 'read_file', 'write_file', 'list_dir', 'cancel', "
    "'prepare_workspace', 'release_workspace', 'search', 'glob')"
)


def upgrade() -> None:
    op.drop_constraint(op.f("ck_commands_kind"), "commands", type_="check")
    op.create_check_constraint(op.f("ck_commands_kind"), "commands", _NEW_KINDS)
    op.add_column("tickets", sa.Column("workspace", sa.Text(), nullable=True))
    op.add_column("tickets", sa.Column("workspace_base", sa.String(30), nullable=True))
    op.add_column(
        "tickets", sa.Column("workspace_released_at", sa.DateTime(timezone=True), nullable=True)
    )


def downgrade() -> None:
    op.execute(
        "DELETE FROM commands WHERE kind IN "
        "('prepare_workspace', 'release_workspace', 'search', 'glob')"
    )
    op.drop_constraint(op.f("ck_commands_kind"), "commands", type_="check")
    op.create_check_constraint(op.f("ck_commands_kind"), "commands", _OLD_KINDS)
    op.drop_column("tickets", "workspace_released_at")
    op.drop_column("tickets", "workspace_base")
    op.drop_column("tickets", "workspace")
