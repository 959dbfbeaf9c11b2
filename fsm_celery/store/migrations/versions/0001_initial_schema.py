"""initial schema"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None


def upgrade() -> None:
    op.create_table(
        "rejected_messages",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column(
            "received_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.Column("reason", sa.String(length=32), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("machine_id", sa.Uuid(), nullable=True),
        sa.Column("state", sa.String(length=50), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=True),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("rejected_messages", schema=None) as batch_op:
        batch_op.create_index("idx_rejected_machine", ["machine_id"], unique=False)
        batch_op.create_index("idx_rejected_reason", ["reason", "received_at"], unique=False)

    op.create_table(
        "state_machine_definitions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("type", sa.String(length=50), nullable=False),
        sa.Column("agent_type", sa.String(length=10), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column(
            "states",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("initial_state", sa.String(length=50), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column(
            "body",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("type", "version", name="uq_definitions_type_version"),
    )
    op.create_table(
        "state_machines",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("type", sa.String(length=50), nullable=False),
        sa.Column("agent_type", sa.String(length=10), nullable=False),
        sa.Column("current_state", sa.String(length=50), nullable=False),
        sa.Column(
            "context",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("status", sa.String(length=20), server_default="running", nullable=False),
        sa.Column("github_issue", sa.Integer(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.Column("definition_version", sa.Integer(), nullable=False),
        sa.Column("agent_id", sa.Uuid(), nullable=True),
        sa.Column("attempt", sa.Integer(), server_default="0", nullable=False),
        sa.Column("state_retries", sa.Integer(), server_default="0", nullable=False),
        sa.Column("entered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("deadline_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("dispatch_due_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("state_machines", schema=None) as batch_op:
        batch_op.create_index("idx_machines_agent", ["agent_type", "status"], unique=False)
        batch_op.create_index(
            "idx_machines_deadline",
            ["deadline_at"],
            unique=False,
            postgresql_where=sa.text("status = 'running'"),
            sqlite_where=sa.text("status = 'running'"),
        )
        batch_op.create_index(
            "idx_machines_dispatch_due",
            ["dispatch_due_at"],
            unique=False,
            postgresql_where=sa.text("status = 'running'"),
            sqlite_where=sa.text("status = 'running'"),
        )
        batch_op.create_index("idx_machines_issue", ["github_issue"], unique=False)
        batch_op.create_index("idx_machines_type_status", ["type", "status"], unique=False)

    op.create_table(
        "state_transitions",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("machine_id", sa.Uuid(), nullable=False),
        sa.Column("from_state", sa.String(length=50), nullable=True),
        sa.Column("to_state", sa.String(length=50), nullable=False),
        sa.Column("success", sa.Boolean(), nullable=False),
        sa.Column(
            "output",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("duration_ms", sa.Integer(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("event", sa.String(length=20), nullable=False),
        sa.Column("actor", sa.String(length=100), nullable=True),
        sa.ForeignKeyConstraint(
            ["machine_id"],
            ["state_machines.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("machine_id", "attempt", name="uq_transitions_machine_attempt"),
    )
    with op.batch_alter_table("state_transitions", schema=None) as batch_op:
        batch_op.create_index("idx_transitions_machine", ["machine_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("state_transitions", schema=None) as batch_op:
        batch_op.drop_index("idx_transitions_machine")

    op.drop_table("state_transitions")
    with op.batch_alter_table("state_machines", schema=None) as batch_op:
        batch_op.drop_index("idx_machines_type_status")
        batch_op.drop_index("idx_machines_issue")
        batch_op.drop_index(
            "idx_machines_dispatch_due",
            postgresql_where=sa.text("status = 'running'"),
            sqlite_where=sa.text("status = 'running'"),
        )
        batch_op.drop_index(
            "idx_machines_deadline",
            postgresql_where=sa.text("status = 'running'"),
            sqlite_where=sa.text("status = 'running'"),
        )
        batch_op.drop_index("idx_machines_agent")

    op.drop_table("state_machines")
    op.drop_table("state_machine_definitions")
    with op.batch_alter_table("rejected_messages", schema=None) as batch_op:
        batch_op.drop_index("idx_rejected_reason")
        batch_op.drop_index("idx_rejected_machine")

    op.drop_table("rejected_messages")
