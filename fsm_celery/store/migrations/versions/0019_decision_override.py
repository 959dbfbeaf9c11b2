"""a decision at an approval gate records whether it was an override: an admin's or the CLI's
decision decides the gate outright and counts as nobody's vote (only approvers, each under the
name they authenticated with, make a quorum); decisions recorded before were all counted as
votes, so they stay false

A constant default: PostgreSQL rewrites nothing.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"


def upgrade() -> None:
    op.add_column(
        "approval_decisions",
        sa.Column("override", sa.Boolean, nullable=False, server_default=sa.false()),
    )


def downgrade() -> None:
    op.drop_column("approval_decisions", "override")
