"""heartbeats and admin commands"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"


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
