"""devices report their sandbox

``devices.sandbox`` is how the device confines the commands it runs, in one line, as its
last Hello said (endpointd's sandbox summary, e.g. ``required; Landlock ABI 7 + seccomp +
private /proc; network allow``). NULL until a daemon that reports it connects: older ones
send nothing, and the console shows "unknown (daemon too old)".

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02 03:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("devices", sa.Column("sandbox", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("devices", "sandbox")
