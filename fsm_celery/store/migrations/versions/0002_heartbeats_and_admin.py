"""heartbeats and admin commands

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 23:05:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("state_machines") as batch:
        batch.add_column(sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("progress", sa.Text(), nullable=True))
    with op.batch_alter_table("state_transitions") as batch:
        batch.add_column(sa.Column("reason", sa.Text(), nullable=True))
        batch.add_column(sa.Column("progress", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("state_transitions") as batch:
        batch.drop_column("progress")
        batch.drop_column("reason")
    with op.batch_alter_table("state_machines") as batch:
        batch.drop_column("progress")
        batch.drop_column("heartbeat_at")
