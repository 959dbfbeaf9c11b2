"""the history records what each transition changed in its machine's context (the start row,
the starting context), so that the context at any step can be reconstructed without a snapshot
per row; rows recorded before have none (their steps' contexts are not known)

A nullable column without a default: PostgreSQL adds it without rewriting the table.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0014"
down_revision = "0013"

Json = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.add_column("state_transitions", sa.Column("context_delta", Json))


def downgrade() -> None:
    with op.batch_alter_table("state_transitions") as batch:
        batch.drop_column("context_delta")
