"""the dashboard: indexes to list machines newest first by each filter; GitHub deliveries seen;
the notification outbox; the statistics folded from the history
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0007"
down_revision = "0006"

Json = sa.JSON().with_variant(JSONB(), "postgresql")
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
NOW = sa.text("CURRENT_TIMESTAMP")
AT_WORK = sa.text("status IN ('running', 'paused')")
PENDING = sa.text("status = 'pending'")


def upgrade() -> None:
    op.create_index("idx_machines_created", "state_machines", ["created_at", "id"])
    op.create_index("idx_machines_status_created", "state_machines", ["status", "created_at"])
    op.create_index("idx_machines_agent_id_created", "state_machines", ["agent_id", "created_at"])
    op.create_index(
        "idx_machines_at_work",
        "state_machines",
        ["agent_id"],
        postgresql_where=AT_WORK,
        sqlite_where=AT_WORK,
    )
    op.create_table(
        "budget_changes",
        sa.Column("id", BigId, primary_key=True),
        sa.Column("machine_id", sa.Uuid, sa.ForeignKey("state_machines.id"), nullable=False),
        sa.Column("actor", sa.String(100), nullable=False),
        sa.Column("reason", sa.Text, nullable=False, server_default=""),
        sa.Column("tokens", sa.BigInteger),
        sa.Column("cost", sa.Float),
        sa.Column("previous_tokens", sa.BigInteger),
        sa.Column("previous_cost", sa.Float),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
    )
    op.create_index("idx_budget_changes_machine", "budget_changes", ["machine_id"])
    op.create_table(
        "github_deliveries",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("event", sa.String(50), nullable=False),
        sa.Column("action", sa.String(50)),
        sa.Column("repository", sa.String(200)),
        sa.Column("issue", sa.Integer),
        sa.Column("outcome", sa.String(20), nullable=False),
        sa.Column("machine_id", sa.Uuid),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
    )
    op.create_index("idx_github_deliveries_issue", "github_deliveries", ["repository", "issue"])
    op.create_table(
        "notifications",
        sa.Column("id", BigId, primary_key=True),
        sa.Column("machine_id", sa.Uuid, nullable=False),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("event", sa.String(20), nullable=False),
        sa.Column("payload", Json, nullable=False),
        sa.Column("status", sa.String(12), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_error", sa.Text),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
        sa.Column("delivered_at", sa.DateTime(timezone=True)),
    )
    op.create_index(
        "idx_notifications_due",
        "notifications",
        ["next_attempt_at"],
        postgresql_where=PENDING,
        sqlite_where=PENDING,
    )
    op.create_index("idx_notifications_machine", "notifications", ["machine_id"])
    op.create_table(
        "state_stats",
        sa.Column("machine_type", sa.String(50), primary_key=True),
        sa.Column("state", sa.String(50), primary_key=True),
        sa.Column("bucket", sa.SmallInteger, primary_key=True),
        sa.Column("attempts", sa.BigInteger, nullable=False),
        sa.Column("successes", sa.BigInteger, nullable=False),
        sa.Column("duration_ms", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "agent_usage",
        sa.Column("agent_id", sa.Uuid, primary_key=True),
        sa.Column("attempts", sa.BigInteger, nullable=False),
        sa.Column("tokens", sa.BigInteger, nullable=False),
        sa.Column("cost", sa.Float, nullable=False),
    )
    op.create_table(
        "rollups",
        sa.Column("name", sa.String(50), primary_key=True),
        sa.Column("last_id", sa.BigInteger, nullable=False),
        sa.Column("pending_id", sa.BigInteger),
        sa.Column("pending_snapshot", sa.String(200)),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
    )


def downgrade() -> None:
    op.drop_table("rollups")
    op.drop_table("agent_usage")
    op.drop_table("state_stats")
    op.drop_index("idx_notifications_machine", "notifications")
    op.drop_index("idx_notifications_due", "notifications")
    op.drop_table("notifications")
    op.drop_index("idx_budget_changes_machine", "budget_changes")
    op.drop_table("budget_changes")
    op.drop_index("idx_github_deliveries_issue", "github_deliveries")
    op.drop_table("github_deliveries")
    for name in (
        "idx_machines_at_work",
        "idx_machines_agent_id_created",
        "idx_machines_status_created",
        "idx_machines_created",
    ):
        op.drop_index(name, "state_machines")
