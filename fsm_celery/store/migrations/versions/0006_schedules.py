"""schedules, the ticks they ran and what operators did to them; when beat's scan last ran"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0006"
down_revision = "0005"

Json = sa.JSON().with_variant(JSONB(), "postgresql")
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _created() -> sa.Column[object]:
    return sa.Column(
        "created_at",
        sa.DateTime(timezone=True),
        nullable=False,
        server_default=sa.text("CURRENT_TIMESTAMP"),
    )


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("machine_type", sa.String(50), nullable=False),
        sa.Column("name", sa.String(50), nullable=False),
        sa.Column("cron", sa.String(100), nullable=False),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("context", Json, nullable=False),
        sa.Column("overlap", sa.String(8), nullable=False),
        sa.Column("paused", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("next_run_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_tick_at", sa.DateTime(timezone=True)),
        sa.Column("last_machine_id", sa.Uuid),
        sa.Column("removed_at", sa.DateTime(timezone=True)),
        _created(),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("CURRENT_TIMESTAMP"),
        ),
        sa.UniqueConstraint("machine_type", "name", name="uq_schedules_type_name"),
    )
    op.create_index("idx_schedules_due", "schedules", ["next_run_at"])
    op.create_table(
        "schedule_runs",
        sa.Column("schedule_id", sa.Integer, sa.ForeignKey("schedules.id"), primary_key=True),
        sa.Column("tick_at", sa.DateTime(timezone=True), primary_key=True),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("machine_id", sa.Uuid),
        sa.Column("detail", sa.Text),
        sa.Column("actor", sa.String(100)),
        _created(),
    )
    op.create_table(
        "schedule_events",
        sa.Column("id", BigId, primary_key=True),
        sa.Column("schedule_id", sa.Integer, sa.ForeignKey("schedules.id"), nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("actor", sa.String(100), nullable=False),
        sa.Column("reason", sa.Text, nullable=False, server_default=""),
        sa.Column("detail", Json),
        _created(),
    )
    op.create_index(
        "idx_schedule_events_schedule", "schedule_events", ["schedule_id", "created_at"]
    )
    op.create_table(
        "liveness",
        sa.Column("name", sa.String(50), primary_key=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("liveness")
    op.drop_index("idx_schedule_events_schedule", "schedule_events")
    op.drop_table("schedule_events")
    op.drop_table("schedule_runs")
    op.drop_index("idx_schedules_due", "schedules")
    op.drop_table("schedules")
