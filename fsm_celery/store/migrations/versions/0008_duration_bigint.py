"""an attempt's duration in BIGINT milliseconds: INTEGER holds 24.8 days, and a state may wait
30 (a machine paused or failed for longer ends an attempt longer still)

PostgreSQL rewrites the whole of state_transitions for it, under a lock that holds the engine's
writes back until it is done: on a long history, run it while the workers and the bridge are
stopped.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"


def upgrade() -> None:
    with op.batch_alter_table("state_transitions") as batch:
        batch.alter_column(
            "duration_ms", existing_type=sa.Integer(), type_=sa.BigInteger(), existing_nullable=True
        )


def downgrade() -> None:
    # Durations past INTEGER's range are kept as its largest value rather than refused.
    op.execute(
        sa.text(
            "UPDATE state_transitions SET duration_ms = 2147483647 WHERE duration_ms > 2147483647"
        )
    )
    with op.batch_alter_table("state_transitions") as batch:
        batch.alter_column(
            "duration_ms", existing_type=sa.BigInteger(), type_=sa.Integer(), existing_nullable=True
        )
