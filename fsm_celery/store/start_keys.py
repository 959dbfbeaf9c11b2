"""Start keys (idempotent starts, fsm_celery.core.start_key): the table, and its helpers, which
take the connection and never commit.

A table of its own rather than a column of state_machines: a key is written once, by the start
that takes it, and read by a start repeated with it or by a reader of one machine; the hot
state_machines row, which every transition updates, stays as narrow as it was, and a start
without a key writes nothing more than before. The key is the primary key, so a second start
with it conflicts on INSERT ... ON CONFLICT DO NOTHING, on PostgreSQL after waiting for the
first's transaction to end (whichever way). Its machine is written after it in the same
transaction: the foreign key is checked at COMMIT (DEFERRABLE INITIALLY DEFERRED), and the row
goes with its machine (ON DELETE CASCADE).
"""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from sqlalchemy import Column, Connection, ForeignKey, Index, Integer, String, Table, Uuid, select

from fsm_celery.core.start_key import KEY_CHARS, KeyedStart
from fsm_celery.store import dialects
from fsm_celery.store.columns import TYPE_CHARS, at
from fsm_celery.store.tables import metadata

start_keys = Table(
    "start_keys",
    metadata,
    Column("key", String(KEY_CHARS), primary_key=True),
    Column(
        "machine_id",
        Uuid,
        ForeignKey("state_machines.id", ondelete="CASCADE", deferrable=True, initially="DEFERRED"),
        nullable=False,
    ),
    # what the start asked (core.start_key.KeyedStart): a start repeated with the key must ask it
    Column("machine_type", String(TYPE_CHARS), nullable=False),
    Column("context_digest", String(64), nullable=False),
    Column("agent_id", Uuid),
    Column("github_issue", Integer),
    at("created_at", nullable=False),
    Index("idx_start_keys_machine", "machine_id", unique=True),
)


def claim_txn(conn: Connection, asked: KeyedStart, machine_id: UUID, now: datetime) -> bool:
    """Take the key for the machine about to be written; False when a start holds it already
    (PostgreSQL: one that committed while this waited)."""
    statement = (
        dialects.of(conn)
        .insert(start_keys)
        .values(
            key=asked.key,
            machine_id=machine_id,
            machine_type=asked.machine_type,
            context_digest=asked.context_digest,
            agent_id=asked.agent_id,
            github_issue=asked.github_issue,
            created_at=now,
        )
        .on_conflict_do_nothing(index_elements=[start_keys.c.key])
    )
    return conn.execute(statement).rowcount == 1


def held_txn(conn: Connection, key: str) -> tuple[KeyedStart, UUID] | None:
    """What the key's start asked, and its machine; None when no start holds the key."""
    row = conn.execute(select(start_keys).where(start_keys.c.key == key)).first()
    if row is None:
        return None
    held = KeyedStart(row.key, row.machine_type, row.context_digest, row.agent_id, row.github_issue)
    return held, row.machine_id


def key_of_txn(conn: Connection, machine_id: UUID) -> str | None:
    """The key the machine was started with, if any."""
    key: str | None = conn.execute(
        select(start_keys.c.key).where(start_keys.c.machine_id == machine_id)
    ).scalar()
    return key
