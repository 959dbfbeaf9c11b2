"""indexes for listing machines newest first by type, and by agent type and status"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"


def upgrade() -> None:
    with op.batch_alter_table("state_machines") as batch:
        batch.create_index("idx_machines_type_created", ["type", "created_at"])
        batch.create_index("idx_machines_agent_created", ["agent_type", "status", "created_at"])


def downgrade() -> None:
    with op.batch_alter_table("state_machines") as batch:
        batch.drop_index("idx_machines_agent_created")
        batch.drop_index("idx_machines_type_created")
