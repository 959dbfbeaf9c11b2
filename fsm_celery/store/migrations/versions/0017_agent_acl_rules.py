"""an agent's Redis ACL user is kept as its rules (the password as its SHA-256 hash, never
itself), so that the bridge can create it again on a Redis that lost it: restarted without an
aclfile, or a replica promoted by Sentinel (ACL users are not replicated)

Added with ALTER TABLE ... ADD COLUMN (no batch on SQLite: see 0015); nullable, no default.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0017"
down_revision = "0016"

Json = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.add_column("agents", sa.Column("acl_rules", Json))


def downgrade() -> None:
    op.drop_column("agents", "acl_rules")
