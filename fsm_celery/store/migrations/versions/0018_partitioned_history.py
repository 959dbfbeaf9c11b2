"""the history and the rejected messages partitioned by month on PostgreSQL (fsm_celery.store.
partitions): state_transitions by its machine's creation time, a new column on each row, so its
one-row-per-attempt key stays enforced (a partitioned table's unique keys hold its partition
key) and a machine's rows lie in one partition; rejected_messages by the time received.

Each table is rebuilt: the old one renamed, the new one created (partitioned on PostgreSQL, its
months from the oldest row's through AHEAD months from now), the rows copied with their ids
(the id sequences carry on: the statistics' fold reads the history by id), the old one dropped.
The copy holds the tables for as long as it runs: stop the workers and bridges first, as for
any migration (on this machine, about a million history rows in 15 s). state_transitions loses
its foreign key to state_machines (it would lock state_machines whenever a month is attached or
detached) and its index on machine_id alone (the unique key's first column serves). On SQLite
state_transitions is rebuilt the same way, unpartitioned (rejected_messages does not change).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.schema import SchemaItem

from fsm_celery.store import partitions

revision = "0018"
down_revision = "0017"

Json = sa.JSON().with_variant(JSONB(), "postgresql")
NOW = sa.text("CURRENT_TIMESTAMP")
HISTORY, REJECTED = partitions.HISTORY, partitions.REJECTED
HISTORY_COLUMNS = (
    "id, machine_id, from_state, to_state, success, output, error_message, duration_ms, "
    "created_at, attempt, event, actor, reason, progress, agent_id, tokens_used, cost, "
    "context_delta, failure"
)
REJECTED_COLUMNS = "id, received_at, reason, detail, machine_id, state, attempt, payload"


def _id(table: str, postgres: bool) -> sa.Column[int]:
    if postgres:  # the old table's sequence, taken over (ids carry on)
        return sa.Column(
            "id",
            sa.BigInteger,
            server_default=sa.text(f"nextval('{table}_id_seq')"),
            nullable=False,
        )
    return sa.Column("id", sa.Integer, primary_key=True)


def _history(postgres: bool, upgraded: bool) -> list[SchemaItem]:
    items: list[SchemaItem] = [
        _id(HISTORY, postgres),
        sa.Column("machine_id", sa.Uuid, nullable=False),
        sa.Column("from_state", sa.String(50)),
        sa.Column("to_state", sa.String(50), nullable=False),
        sa.Column("success", sa.Boolean, nullable=False),
        sa.Column("output", Json),
        sa.Column("error_message", sa.Text),
        sa.Column("duration_ms", sa.BigInteger),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("event", sa.String(20), nullable=False),
        sa.Column("actor", sa.String(100)),
        sa.Column("reason", sa.Text),
        sa.Column("progress", sa.Text),
        sa.Column("agent_id", sa.Uuid),
        sa.Column("tokens_used", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("cost", sa.Float, nullable=False, server_default="0"),
        sa.Column("context_delta", Json),
        sa.Column("failure", sa.String(20)),
    ]
    if upgraded:  # partitioned on PostgreSQL; SQLite's the same, unpartitioned
        items += [
            sa.Column("machine_created_at", sa.DateTime(timezone=True), nullable=False),
            sa.UniqueConstraint(
                "machine_id", "attempt", "machine_created_at", name="uq_transitions_machine_attempt"
            ),
        ]
    else:  # as before 0018
        items += [
            sa.ForeignKeyConstraint(["machine_id"], ["state_machines.id"]),
            sa.UniqueConstraint("machine_id", "attempt", name="uq_transitions_machine_attempt"),
        ]
    if postgres:
        key = ("id", "machine_created_at") if upgraded else ("id",)
        items.append(sa.PrimaryKeyConstraint(*key, name=f"{HISTORY}_pkey"))
    return items


def _rejected(partitioned: bool) -> list[SchemaItem]:
    key = ("id", "received_at") if partitioned else ("id",)
    return [
        _id(REJECTED, True),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
        sa.Column("reason", sa.String(32), nullable=False),
        sa.Column("detail", sa.Text, nullable=False),
        sa.Column("machine_id", sa.Uuid),
        sa.Column("state", sa.String(50)),
        sa.Column("attempt", sa.Integer),
        sa.Column("payload", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint(*key, name=f"{REJECTED}_pkey"),
    ]


def _rebuild(
    table: str,
    items: list[SchemaItem],
    copy: str,
    indexes: dict[str, list[str]],
    drop_indexes: list[str],
    partition_key: str | None,
    oldest: Callable[[], datetime | None],
) -> None:
    """Rename the table, create it anew (partitioned by partition_key when given), copy its
    rows, drop the old one, create its indexes."""
    postgres = op.get_bind().dialect.name == "postgresql"
    first = oldest() if partition_key else None  # read before the table is renamed
    for index in drop_indexes:
        op.drop_index(index, table_name=table)
    if postgres:
        op.execute(f"ALTER TABLE {table} RENAME CONSTRAINT {table}_pkey TO {table}_old_pkey")
        if table == HISTORY:  # its name is the new table's (constraints' indexes share names)
            op.execute(f"ALTER TABLE {table} DROP CONSTRAINT uq_transitions_machine_attempt")
    op.rename_table(table, f"{table}_old")
    options: dict[str, Any] = {}
    if partition_key:
        options["postgresql_partition_by"] = f"RANGE ({partition_key})"
    op.create_table(table, *items, **options)
    if postgres and partition_key:
        now = datetime.now(UTC)
        for start in partitions.months(first or now, partitions.ahead(now)):
            for statement in partitions.create_statements(table, start):
                op.execute(statement)
    op.execute(copy)
    if postgres:
        op.execute(f"ALTER SEQUENCE {table}_id_seq OWNED BY {table}.id")
    op.drop_table(f"{table}_old")
    for index, index_columns in indexes.items():
        op.create_index(index, table, index_columns)


def _oldest(sql: str) -> Callable[[], datetime | None]:
    return lambda: op.get_bind().execute(sa.text(sql)).scalar()


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    _rebuild(
        HISTORY,
        _history(postgres, upgraded=True),
        f"INSERT INTO {HISTORY} ({HISTORY_COLUMNS}, machine_created_at)"
        f" SELECT {', '.join('t.' + c for c in HISTORY_COLUMNS.split(', '))}, m.created_at"
        f" FROM {HISTORY}_old t JOIN state_machines m ON m.id = t.machine_id",
        {"idx_transitions_agent": ["agent_id"]},
        ["idx_transitions_machine", "idx_transitions_agent"],
        "machine_created_at" if postgres else None,
        _oldest("SELECT min(created_at) FROM state_machines"),
    )
    if postgres:
        _rebuild_rejected(partitioned=True)


def downgrade() -> None:
    """One table each again (the months' rows copied back; months archived away stay away)."""
    postgres = op.get_bind().dialect.name == "postgresql"
    _rebuild(
        HISTORY,
        _history(postgres, upgraded=False),
        f"INSERT INTO {HISTORY} ({HISTORY_COLUMNS}) SELECT {HISTORY_COLUMNS} FROM {HISTORY}_old",
        {"idx_transitions_machine": ["machine_id"], "idx_transitions_agent": ["agent_id"]},
        ["idx_transitions_agent"],
        None,
        lambda: None,
    )
    if postgres:
        _rebuild_rejected(partitioned=False)


def _rebuild_rejected(partitioned: bool) -> None:
    """rejected_messages, partitioned by month received or not (PostgreSQL only)."""
    indexes = {
        "idx_rejected_reason": ["reason", "received_at"],
        "idx_rejected_machine": ["machine_id"],
    }
    _rebuild(
        REJECTED,
        _rejected(partitioned),
        f"INSERT INTO {REJECTED} ({REJECTED_COLUMNS})"
        f" SELECT {REJECTED_COLUMNS} FROM {REJECTED}_old",
        indexes,
        list(indexes),
        "received_at" if partitioned else None,
        _oldest(f"SELECT min(received_at) FROM {REJECTED}"),
    )
