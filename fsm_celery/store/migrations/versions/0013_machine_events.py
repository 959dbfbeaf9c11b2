"""outside events sent to machines: applied at once to a machine waiting for one, else kept
until it enters a state that waits for it (a key the sender gives makes a resent event one)
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0013"
down_revision = "0012"

Json = sa.JSON().with_variant(JSONB(), "postgresql")
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
KEPT = sa.text("consumed_at IS NULL")


def upgrade() -> None:
    op.create_table(
        "machine_events",
        sa.Column("id", BigId, primary_key=True),
        sa.Column(
            "machine_id",
            sa.Uuid,
            sa.ForeignKey("state_machines.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("name", sa.String(50), nullable=False),
        sa.Column("payload", Json, nullable=False),
        sa.Column("sender", sa.String(100), nullable=False),
        sa.Column("via", sa.String(20), nullable=False),
        sa.Column("key", sa.String(100)),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("consumed_at", sa.DateTime(timezone=True)),
        sa.Column("attempt", sa.Integer),
        sa.Column("outcome", sa.String(10), nullable=False, server_default="kept"),
        sa.UniqueConstraint("machine_id", "key", name="uq_machine_events_key"),
    )
    op.create_index(
        "idx_machine_events_kept",
        "machine_events",
        ["machine_id", "name", "id"],
        postgresql_where=KEPT,
        sqlite_where=KEPT,
    )


def downgrade() -> None:
    op.drop_table("machine_events")
