"""live machines counted by the fold too: the statistics' counts of running and paused machines
come from machine_counts and its changes, as the finished ones' have since 0011, instead of a
count of every live machine on each read (bench.waiting: `GET /api/stats` at 1,000,000 waiting
machines, p50 179 ms, growing with them).

Every machine now has its counts' change written by triggers on state_machines: its insert
(+1), a change of its status, type or agent type (-1 the old key, +1 the new), its delete (-1),
and a change of its usage alone (one row of the difference, no machine). A transition that
moves a running machine from state to state changes none of those columns and fires nothing;
an ack that reports usage writes one change row. The live machines present at the upgrade are
counted into machine_counts in the migration's transaction, which holds the triggers' lock on
state_machines (no writer commits between the count and the new triggers).

SQLite: see 0010 on its batch operations and triggers.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0025"
down_revision = "0024"

FINISHED = "('completed', 'failed', 'cancelled')"
ROW_COST = "1.9490628022799996e+289"  # fsm_celery.store.rollup.ROW_COST: a row's share of a sum
MOST = "9223372036854775807"
INSERT = "INSERT INTO machine_count_changes (type, agent_type, status, machines, tokens, cost)"
COLUMNS = "status, type, agent_type, tokens_used, cost"
SAME_KEY = "OLD.status = NEW.status AND OLD.type = NEW.type AND OLD.agent_type = NEW.agent_type"
CHANGED = (
    "OLD.status IS DISTINCT FROM NEW.status OR OLD.type IS DISTINCT FROM NEW.type"
    " OR OLD.agent_type IS DISTINCT FROM NEW.agent_type"
    " OR OLD.tokens_used IS DISTINCT FROM NEW.tokens_used OR OLD.cost IS DISTINCT FROM NEW.cost"
)
TRIGGERS = ("fsm_machine_count_delete", "fsm_machine_count_update", "fsm_machine_count_insert")


def _cost(row: str) -> str:
    return f"CASE WHEN {row}.cost > {ROW_COST} THEN {ROW_COST} ELSE {row}.cost END"


def _change(row: str, sign: str) -> str:
    """The change a machine row (OLD or NEW) makes to the counts, as an INSERT's values."""
    return (
        f"{INSERT} SELECT {row}.type, {row}.agent_type, {row}.status, {sign}1,"
        f" {sign}{row}.tokens_used, {sign}({_cost(row)})"
    )


USAGE = (  # a machine whose key is the same: the difference of its usage, no machine
    f"{INSERT} SELECT NEW.type, NEW.agent_type, NEW.status, 0,"
    f" NEW.tokens_used - OLD.tokens_used, ({_cost('NEW')}) - ({_cost('OLD')})"
)

FUNCTION_POSTGRESQL = f"""
CREATE OR REPLACE FUNCTION fsm_machine_count() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND {SAME_KEY} THEN
        {USAGE};
        RETURN NULL;
    END IF;
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        {_change("OLD", "-")};
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        {_change("NEW", "")};
    END IF;
    RETURN NULL;
END
$$
"""
TRIGGERS_POSTGRESQL = [
    "CREATE TRIGGER fsm_machine_count_insert AFTER INSERT ON state_machines"
    " FOR EACH ROW EXECUTE FUNCTION fsm_machine_count()",
    f"CREATE TRIGGER fsm_machine_count_update AFTER UPDATE OF {COLUMNS} ON state_machines"
    f" FOR EACH ROW WHEN ({CHANGED}) EXECUTE FUNCTION fsm_machine_count()",
    "CREATE TRIGGER fsm_machine_count_delete AFTER DELETE ON state_machines"
    " FOR EACH ROW EXECUTE FUNCTION fsm_machine_count()",
]
TRIGGERS_SQLITE = [
    "CREATE TRIGGER fsm_machine_count_insert AFTER INSERT ON state_machines"
    f" BEGIN {_change('NEW', '')}; END",
    f"CREATE TRIGGER fsm_machine_count_update AFTER UPDATE OF {COLUMNS} ON state_machines"
    f" WHEN {CHANGED} BEGIN"
    f" {USAGE} WHERE {SAME_KEY};"
    f" {_change('OLD', '-')} WHERE NOT ({SAME_KEY});"
    f" {_change('NEW', '')} WHERE NOT ({SAME_KEY}); END",
    "CREATE TRIGGER fsm_machine_count_delete AFTER DELETE ON state_machines"
    f" BEGIN {_change('OLD', '-')}; END",
]


def _drop_triggers(postgresql: bool) -> None:
    for name in TRIGGERS:
        op.execute(f"DROP TRIGGER {name}" + (" ON state_machines" if postgresql else ""))


def _count(where: str, postgresql: bool) -> str:
    tokens = f"LEAST(sum(tokens_used), {MOST})" if postgresql else "sum(tokens_used)"
    return (
        "INSERT INTO machine_counts (type, agent_type, status, machines, tokens, cost)"
        f" SELECT type, agent_type, status, count(*), {tokens}, sum({_cost('state_machines')})"
        f" FROM state_machines WHERE {where} GROUP BY type, agent_type, status"
    )


def upgrade() -> None:
    postgresql = op.get_bind().dialect.name == "postgresql"
    if postgresql:  # the triggers' lock first: no machine changes until this commits
        op.execute("LOCK TABLE state_machines IN SHARE ROW EXCLUSIVE MODE")
    _drop_triggers(postgresql)
    op.execute(_count(f"status NOT IN {FINISHED}", postgresql))
    if postgresql:
        op.execute(FUNCTION_POSTGRESQL)
        for statement in TRIGGERS_POSTGRESQL:
            op.execute(statement)
    else:
        for statement in TRIGGERS_SQLITE:
            op.execute(statement)


def downgrade() -> None:
    """Back to 0011's triggers: the finished machines' counts only (the live ones' are
    removed, and their changes not folded yet)."""
    before = _revision_0011()
    postgresql = op.get_bind().dialect.name == "postgresql"
    _drop_triggers(postgresql)
    for table in ("machine_counts", "machine_count_changes"):
        op.execute(f"DELETE FROM {table} WHERE status NOT IN {FINISHED}")
    if postgresql:
        op.execute("DROP FUNCTION fsm_machine_count()")
        op.execute(before.FUNCTION_POSTGRESQL)
    for statement in before.TRIGGERS_POSTGRESQL if postgresql else before.TRIGGERS_SQLITE:
        op.execute(statement)


def _revision_0011() -> ModuleType:
    """Migration 0011's module (its triggers), loaded from beside this one."""
    path = Path(__file__).with_name("0011_machine_counts.py")
    spec = importlib.util.spec_from_file_location("fsm_migration_0011", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
