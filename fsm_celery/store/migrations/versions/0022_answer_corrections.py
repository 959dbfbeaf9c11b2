"""an answer that breaks its state's contract goes back to its agent to correct within the
attempt: the machine counts the refusals of its current attempt (set back to 0 by the next), so
that the hot path knows them without reading the history

Added with ALTER TABLE ... ADD COLUMN on both databases (no batch on SQLite, which would drop
the triggers of 0010 and 0011 with the table it recreates); a constant default: PostgreSQL
rewrites nothing.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"


def upgrade() -> None:
    op.add_column(
        "state_machines",
        sa.Column("corrections", sa.Integer, nullable=False, server_default="0"),
    )


def downgrade() -> None:
    op.drop_column("state_machines", "corrections")
