"""an answer that breaks its state's contract goes back to its agent to correct within the
attempt (fsm_celery.core.correction): the machine counts the refusals of its current attempt
(state_machines.corrections, set back to 0 by the next attempt), so that the hot path knows them
without reading the history; each refusal is a history row of its own, numbered within its
attempt (state_transitions.correction, 1...), the attempt's own row 0: the one-row-per-attempt
key takes the number in, and still holds each attempt to one row that ends it.

The columns are added with ALTER TABLE ... ADD COLUMN on both databases (no batch on SQLite for
state_machines, which would drop the triggers of 0010 and 0011 with the table it recreates); a
constant default: PostgreSQL rewrites nothing. The key is dropped and made again: on PostgreSQL
on the partitioned table, which makes it on each month; SQLite rebuilds state_transitions (it
has no triggers) in a batch.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"

KEY = "uq_transitions_machine_attempt"
HISTORY = "state_transitions"
BEFORE = ["machine_id", "attempt", "machine_created_at"]
AFTER = ["machine_id", "attempt", "correction", "machine_created_at"]


def upgrade() -> None:
    op.add_column(
        "state_machines",
        sa.Column("corrections", sa.Integer, nullable=False, server_default="0"),
    )
    op.add_column(
        HISTORY, sa.Column("correction", sa.SmallInteger, nullable=False, server_default="0")
    )
    _key(AFTER)


def downgrade() -> None:
    op.execute(f"DELETE FROM {HISTORY} WHERE correction <> 0")  # the refusals' rows
    _key(BEFORE)
    if op.get_bind().dialect.name == "postgresql":
        op.drop_column(HISTORY, "correction")
    else:
        with op.batch_alter_table(HISTORY, recreate="always") as batch:
            batch.drop_column("correction")
    op.drop_column("state_machines", "corrections")


def _key(columns: list[str]) -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.drop_constraint(KEY, HISTORY, type_="unique")
        op.create_unique_constraint(KEY, HISTORY, columns)
        return
    with op.batch_alter_table(HISTORY, recreate="always") as batch:
        batch.drop_constraint(KEY, type_="unique")
        batch.create_unique_constraint(KEY, columns)
