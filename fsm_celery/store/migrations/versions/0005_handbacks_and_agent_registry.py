"""hand-backs in a row per machine; the type an agent's credentials were issued for"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"


def upgrade() -> None:
    with op.batch_alter_table("state_machines") as batch:
        batch.add_column(sa.Column("handbacks", sa.Integer, nullable=False, server_default="0"))
    with op.batch_alter_table("agents") as batch:
        batch.add_column(sa.Column("registered_type", sa.String(10)))


def downgrade() -> None:
    with op.batch_alter_table("agents") as batch:
        batch.drop_column("registered_type")
    with op.batch_alter_table("state_machines") as batch:
        batch.drop_column("handbacks")
