"""the history records the kind of each failed transition (failure, timeout, invalid_output,
dispatch): an agent's `success: false` is told from an answer it gave as a success that the
definition refused (a required key missing, a guard that failed on it), which replay needs to
give the core the event it was given; rows recorded before have none (replay infers it from the
error the core wrote)

Added with ALTER TABLE ... ADD COLUMN on both databases (no batch on SQLite, which would drop
the triggers of 0010 and 0011 with the table it recreates); nullable, no default: PostgreSQL
rewrites nothing.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"


def upgrade() -> None:
    op.add_column("state_transitions", sa.Column("failure", sa.String(20)))


def downgrade() -> None:
    op.drop_column("state_transitions", "failure")
