"""approval gates: a row per visit of a machine to an approval state (its counters written in
the transaction that records a decision), and each person's decision, one per person and gate
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0012"
down_revision = "0011"

Json = sa.JSON().with_variant(JSONB(), "postgresql")
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
NOW = sa.text("CURRENT_TIMESTAMP")
OPEN = sa.text("closed_at IS NULL")


def upgrade() -> None:
    op.create_table(
        "approval_gates",
        sa.Column("id", BigId, primary_key=True),
        sa.Column(
            "machine_id",
            sa.Uuid,
            sa.ForeignKey("state_machines.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("state", sa.String(50), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("opened_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deadline_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("approvals", sa.Integer, nullable=False, server_default="0"),
        sa.Column("rejections", sa.Integer, nullable=False, server_default="0"),
        sa.Column("needed", sa.Integer, nullable=False),
        sa.Column("verdict", sa.String(10), nullable=False, server_default="pending"),
        sa.Column("closed_at", sa.DateTime(timezone=True)),
    )
    op.create_index(
        "idx_approval_gates_open",
        "approval_gates",
        ["machine_id"],
        unique=True,
        postgresql_where=OPEN,
        sqlite_where=OPEN,
    )
    op.create_index("idx_approval_gates_machine", "approval_gates", ["machine_id", "id"])
    op.create_table(
        "approval_decisions",
        sa.Column("id", BigId, primary_key=True),
        sa.Column(
            "gate_id",
            BigId,
            sa.ForeignKey("approval_gates.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("machine_id", sa.Uuid, nullable=False),
        sa.Column("actor", sa.String(200), nullable=False),
        sa.Column("decision", sa.String(10), nullable=False),
        sa.Column("fields", Json, nullable=False),
        sa.Column("comment", sa.Text, nullable=False, server_default=""),
        sa.Column("via", sa.String(20), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
        sa.UniqueConstraint("gate_id", "actor", name="uq_approval_decisions_gate_actor"),
    )
    op.create_index("idx_approval_decisions_machine", "approval_decisions", ["machine_id"])


def downgrade() -> None:
    op.drop_table("approval_decisions")
    op.drop_table("approval_gates")
