"""a map's shared input is stored once, on its fan-out: what every child's input reads only
from the parent's context (a query, a configuration) is rendered once into fan_outs.shared,
and each slot keeps its own part; fan-outs opened before have none (their slots hold it all)

Added with ALTER TABLE ... ADD COLUMN on both databases; nullable, no default: PostgreSQL
rewrites nothing.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0021"
down_revision = "0020"


def upgrade() -> None:
    op.add_column("fan_outs", sa.Column("shared", sa.JSON().with_variant(JSONB(), "postgresql")))


def downgrade() -> None:
    op.drop_column("fan_outs", "shared")
