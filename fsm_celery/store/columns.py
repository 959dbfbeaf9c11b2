"""The column types and the groups of columns the tables share (fsm_celery.store.tables)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    Uuid,
    false,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.types import TypeEngine

Json = JSON().with_variant(JSONB(), "postgresql")
BigId = BigInteger().with_variant(Integer(), "sqlite")  # SQLite autoincrements INTEGER only
NOW = text("CURRENT_TIMESTAMP")  # portable: PostgreSQL and SQLite
TYPE_CHARS = 120  # a child's type names its place: research_fanout.research (0009: 50)


def at(name: str, **kwargs: Any) -> Column[Any]:
    """A moment, with its time zone."""
    return Column(name, DateTime(timezone=True), **kwargs)


def flag(name: str) -> Column[Any]:
    """A yes or no, no until set."""
    return Column(name, Boolean, nullable=False, server_default=false())


def created(name: str = "created_at") -> Column[Any]:
    """When the row was written (the database's clock)."""
    return Column(name, DateTime(timezone=True), nullable=False, server_default=NOW)


def updated() -> Column[Any]:
    return Column("updated_at", DateTime(timezone=True), nullable=False, server_default=NOW)


def serial() -> Column[Any]:
    """A row's number (`id`), counted by the database."""
    return Column("id", BigId, primary_key=True)


def zero(name: str, kind: type[TypeEngine[Any]] = Integer) -> Column[Any]:
    """A count (or a sum) that starts at zero."""
    return Column(name, kind, nullable=False, server_default="0")


def usage() -> tuple[Column[Any], Column[Any]]:
    """The tokens and cost the agents reported, summed."""
    return zero("tokens_used", BigInteger), zero("cost", Float)


def why() -> tuple[Column[Any], Column[Any]]:
    """Who did it, and why (an operator's action)."""
    reason = Column("reason", Text, nullable=False, server_default="")
    return Column("actor", String(100), nullable=False), reason


def machine_ref(**kwargs: Any) -> Column[Any]:
    """A row of a machine's own, deleted with it."""
    machine = ForeignKey("state_machines.id", ondelete="CASCADE")
    return Column("machine_id", Uuid, machine, **kwargs)


def partial(name: str, *columns: str, where: str, unique: bool = False) -> Index:
    """An index of the rows `where` selects (SQL), on PostgreSQL and SQLite alike."""
    rows = text(where)
    return Index(name, *columns, unique=unique, postgresql_where=rows, sqlite_where=rows)


def tally(*, key: bool, machines: type[TypeEngine[Any]]) -> tuple[Column[Any], ...]:
    """Finished machines by type, agent type and status (the key when `key`): how many, and
    their tokens and cost."""
    return (
        Column("type", String(TYPE_CHARS), primary_key=key, nullable=False),
        Column("agent_type", String(10), primary_key=key, nullable=False),
        Column("status", String(20), primary_key=key, nullable=False),
        Column("machines", machines, nullable=False),  # in a change: +1 or -1
        Column("tokens", BigInteger, nullable=False),
        Column("cost", Float, nullable=False),
    )
