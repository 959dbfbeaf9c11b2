"""start keys (idempotent starts, fsm_celery.store.start_keys): a start given a key records it,
with what it asked, in a table of its own; a start repeated with the key finds its machine. The
foreign key to state_machines is checked at COMMIT, as the key is taken before its machine is
written, and the key goes with its machine.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"


def upgrade() -> None:
    op.create_table(
        "start_keys",
        sa.Column("key", sa.String(200), primary_key=True),
        sa.Column(
            "machine_id",
            sa.Uuid,
            sa.ForeignKey(
                "state_machines.id", ondelete="CASCADE", deferrable=True, initially="DEFERRED"
            ),
            nullable=False,
        ),
        sa.Column("machine_type", sa.String(120), nullable=False),
        sa.Column("context_digest", sa.String(64), nullable=False),
        sa.Column("agent_id", sa.Uuid),
        sa.Column("github_issue", sa.Integer),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("idx_start_keys_machine", "start_keys", ["machine_id"], unique=True)


def downgrade() -> None:
    op.drop_index("idx_start_keys_machine", "start_keys")
    op.drop_table("start_keys")
