"""forks: a machine started from a past step of another records which and where (the steps
before are the source's, read through the link, not copied)

Added with ALTER TABLE ... ADD COLUMN on both databases (no batch on SQLite: a batch recreates
state_machines and would drop the triggers of 0010 and 0011); nullable, no default: PostgreSQL
rewrites nothing.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"

FORKED = sa.text("forked_from IS NOT NULL")


def upgrade() -> None:
    op.add_column("state_machines", sa.Column("forked_from", sa.Uuid))
    op.add_column("state_machines", sa.Column("forked_at", sa.Integer))
    op.create_index(
        "idx_machines_forked_from",
        "state_machines",
        ["forked_from"],
        postgresql_where=FORKED,
        sqlite_where=FORKED,
    )


def downgrade() -> None:
    op.drop_index("idx_machines_forked_from", "state_machines")
    op.drop_column("state_machines", "forked_at")
    op.drop_column("state_machines", "forked_from")
