"""fan-out: children placed under their parent, the fan-outs' counters and their slots; a
child's type names its place (research_fanout.research), so types grow to 120 characters; and
per agent type, a bound on work in flight with the machines queued for it

Widening a VARCHAR rewrites nothing in PostgreSQL; the new columns are NULL or have a constant
default, which PostgreSQL adds without a rewrite too.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0009"
down_revision = "0008"

Json = sa.JSON().with_variant(JSONB(), "postgresql")
NOW = sa.text("CURRENT_TIMESTAMP")
OPEN = sa.text("closed_at IS NULL")
QUEUED = sa.text("queued_at IS NOT NULL")


def upgrade() -> None:
    with op.batch_alter_table("state_machines") as batch:
        batch.alter_column("type", existing_type=sa.String(50), type_=sa.String(120))
        batch.add_column(sa.Column("parent_id", sa.Uuid))
        batch.add_column(sa.Column("parent_attempt", sa.Integer))
        batch.add_column(sa.Column("slot", sa.Integer))
        batch.add_column(sa.Column("branch", sa.String(50)))
        batch.add_column(sa.Column("root_id", sa.Uuid))
        batch.add_column(sa.Column("depth", sa.SmallInteger, nullable=False, server_default="0"))
        batch.add_column(sa.Column("on_parent_cancel", sa.String(8)))
        batch.add_column(sa.Column("queued_at", sa.DateTime(timezone=True)))
    op.create_index("idx_machines_parent", "state_machines", ["parent_id", "parent_attempt"])
    op.create_index("idx_machines_root", "state_machines", ["root_id"])
    op.create_index(
        "idx_machines_queued",
        "state_machines",
        ["agent_type", "queued_at"],
        postgresql_where=QUEUED,
        sqlite_where=QUEUED,
    )
    op.create_table(
        "agent_type_slots",
        sa.Column("agent_type", sa.String(10), primary_key=True),
        sa.Column("max_in_flight", sa.Integer),
        sa.Column("in_flight", sa.Integer, nullable=False, server_default="0"),
    )
    with op.batch_alter_table("state_stats") as batch:
        batch.alter_column("machine_type", existing_type=sa.String(50), type_=sa.String(120))
    op.create_table(
        "fan_outs",
        sa.Column("parent_id", sa.Uuid, sa.ForeignKey("state_machines.id"), primary_key=True),
        sa.Column("attempt", sa.Integer, primary_key=True),
        sa.Column("state", sa.String(50), nullable=False),
        sa.Column("kind", sa.String(10), nullable=False),
        sa.Column("total", sa.Integer, nullable=False),
        sa.Column("started", sa.Integer, nullable=False),
        sa.Column("succeeded", sa.Integer, nullable=False, server_default="0"),
        sa.Column("failed", sa.Integer, nullable=False, server_default="0"),
        sa.Column("verdict", sa.String(10), nullable=False),
        sa.Column("decided_at", sa.DateTime(timezone=True)),
        sa.Column("decided_by", sa.Uuid),
        sa.Column("closed_at", sa.DateTime(timezone=True)),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
    )
    op.create_index(
        "idx_fan_outs_open", "fan_outs", ["parent_id"], postgresql_where=OPEN, sqlite_where=OPEN
    )
    op.create_table(
        "fan_out_items",
        sa.Column("parent_id", sa.Uuid, primary_key=True),
        sa.Column("attempt", sa.Integer, primary_key=True),
        sa.Column("slot", sa.Integer, primary_key=True),
        sa.Column("input", Json, nullable=False),
        sa.Column("child_id", sa.Uuid),
        sa.Column("status", sa.String(10), nullable=False),
        sa.Column("result", Json),
        sa.Column("error", sa.Text),
    )


def downgrade() -> None:
    op.drop_table("agent_type_slots")
    op.drop_index("idx_machines_queued", table_name="state_machines")
    op.drop_table("fan_out_items")
    op.drop_index("idx_fan_outs_open", table_name="fan_outs")
    op.drop_table("fan_outs")
    with op.batch_alter_table("state_stats") as batch:
        batch.alter_column("machine_type", existing_type=sa.String(120), type_=sa.String(50))
    op.drop_index("idx_machines_root", table_name="state_machines")
    op.drop_index("idx_machines_parent", table_name="state_machines")
    with op.batch_alter_table("state_machines") as batch:
        for column in (
            "queued_at",
            "on_parent_cancel",
            "depth",
            "root_id",
            "branch",
            "slot",
            "parent_attempt",
            "parent_id",
        ):
            batch.drop_column(column)
        batch.alter_column("type", existing_type=sa.String(120), type_=sa.String(50))
