"""indexes for listing machines newest first by type, and by agent type and status

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 00:55:00
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("state_machines") as batch:
        batch.create_index("idx_machines_type_created", ["type", "created_at"])
        batch.create_index("idx_machines_agent_created", ["agent_type", "status", "created_at"])


def downgrade() -> None:
    with op.batch_alter_table("state_machines") as batch:
        batch.drop_index("idx_machines_agent_created")
        batch.drop_index("idx_machines_type_created")
