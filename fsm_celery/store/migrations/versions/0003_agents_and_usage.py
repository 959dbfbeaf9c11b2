"""agents registry, usage accounting and budgets"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"


def upgrade() -> None:
    op.create_table(
        "agents",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("agent_type", sa.String(length=10), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("running", sa.Integer(), nullable=False),
        sa.Column("hostname", sa.String(length=255), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("assigned_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("agents") as batch:
        batch.create_index("idx_agents_type_seen", ["agent_type", "status", "last_seen_at"])
    with op.batch_alter_table("state_machines") as batch:
        batch.add_column(
            sa.Column("agent_pinned", sa.Boolean(), server_default=sa.false(), nullable=False)
        )
        batch.add_column(
            sa.Column("tokens_used", sa.BigInteger(), server_default="0", nullable=False)
        )
        batch.add_column(sa.Column("cost", sa.Float(), server_default="0", nullable=False))
        batch.add_column(sa.Column("budget_tokens", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("budget_cost", sa.Float(), nullable=True))
    with op.batch_alter_table("state_transitions") as batch:
        batch.add_column(sa.Column("agent_id", sa.Uuid(), nullable=True))
        batch.add_column(
            sa.Column("tokens_used", sa.BigInteger(), server_default="0", nullable=False)
        )
        batch.add_column(sa.Column("cost", sa.Float(), server_default="0", nullable=False))
        batch.create_index("idx_transitions_agent", ["agent_id"])


def downgrade() -> None:
    with op.batch_alter_table("state_transitions") as batch:
        batch.drop_index("idx_transitions_agent")
        batch.drop_column("cost")
        batch.drop_column("tokens_used")
        batch.drop_column("agent_id")
    with op.batch_alter_table("state_machines") as batch:
        batch.drop_column("budget_cost")
        batch.drop_column("budget_tokens")
        batch.drop_column("cost")
        batch.drop_column("tokens_used")
        batch.drop_column("agent_pinned")
    with op.batch_alter_table("agents") as batch:
        batch.drop_index("idx_agents_type_seen")
    op.drop_table("agents")
