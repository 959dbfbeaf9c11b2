"""who issued and who revoked an agent's Redis credentials, when and why (agents revoke)"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "agent_credential_events",
        sa.Column("id", BigId, primary_key=True),
        sa.Column("agent_id", sa.Uuid(), nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("actor", sa.String(100), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False, server_default=""),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("CURRENT_TIMESTAMP"),
        ),
    )
    op.create_index(
        "idx_agent_credential_events_agent", "agent_credential_events", ["agent_id", "created_at"]
    )


def downgrade() -> None:
    op.drop_index("idx_agent_credential_events_agent", "agent_credential_events")
    op.drop_table("agent_credential_events")
