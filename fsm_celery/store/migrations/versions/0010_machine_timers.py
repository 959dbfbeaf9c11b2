"""the scan's timers in a table of their own, so that a transition's UPDATE of its machine row
is a HOT update

Every transition sets a new deadline_at (and clears dispatch_due_at). While those two columns
were indexed on state_machines, PostgreSQL could not update a machine in place (a HOT update):
each transition wrote a new entry into every one of the table's 18 indexes, which cost a third
of the inline mode's PostgreSQL time on a small database and more on a large one (issue 26).
The columns stay on state_machines, unindexed, for everything that reads a machine; what the
scan looks up by, a running machine's deadline or dispatch due time, is now kept in
machine_timers, one row per running machine that has either, by triggers on state_machines: no
writer can forget it, and its UPDATE touches three small indexes. state_machines is given room
on each page (fillfactor 80) so that the new version of a row fits beside the old one.

SQLite: its batch operations copy a table into a new one, which drops its triggers; a later
migration that alters state_machines that way must create the triggers again (TRIGGERS_SQLITE).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"

RUNNING = sa.text("status = 'running'")
ARMED = "status = 'running' AND (deadline_at IS NOT NULL OR dispatch_due_at IS NOT NULL)"
NEW_ARMED = (
    "NEW.status = 'running' AND (NEW.deadline_at IS NOT NULL OR NEW.dispatch_due_at IS NOT NULL)"
)
CHANGED = (
    "OLD.status IS DISTINCT FROM NEW.status"
    " OR OLD.deadline_at IS DISTINCT FROM NEW.deadline_at"
    " OR OLD.dispatch_due_at IS DISTINCT FROM NEW.dispatch_due_at"
)

FUNCTION_POSTGRESQL = f"""
CREATE FUNCTION fsm_machine_timer() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF {NEW_ARMED} THEN
        INSERT INTO machine_timers (machine_id, deadline_at, dispatch_due_at)
        VALUES (NEW.id, NEW.deadline_at, NEW.dispatch_due_at)
        ON CONFLICT (machine_id) DO UPDATE
        SET deadline_at = EXCLUDED.deadline_at, dispatch_due_at = EXCLUDED.dispatch_due_at;
    ELSE
        DELETE FROM machine_timers WHERE machine_id = NEW.id;
    END IF;
    RETURN NULL;
END
$$
"""
TRIGGERS_POSTGRESQL = [
    "CREATE TRIGGER fsm_machine_timer_insert AFTER INSERT ON state_machines"
    f" FOR EACH ROW WHEN ({NEW_ARMED}) EXECUTE FUNCTION fsm_machine_timer()",
    "CREATE TRIGGER fsm_machine_timer_update"
    " AFTER UPDATE OF status, deadline_at, dispatch_due_at ON state_machines"
    f" FOR EACH ROW WHEN ({CHANGED}) EXECUTE FUNCTION fsm_machine_timer()",
]
_ARM_SQLITE = (
    "INSERT OR REPLACE INTO machine_timers (machine_id, deadline_at, dispatch_due_at)"
    f" SELECT NEW.id, NEW.deadline_at, NEW.dispatch_due_at WHERE {NEW_ARMED};"
)
TRIGGERS_SQLITE = [
    f"CREATE TRIGGER fsm_machine_timer_insert AFTER INSERT ON state_machines"
    f" WHEN {NEW_ARMED} BEGIN {_ARM_SQLITE} END",
    "CREATE TRIGGER fsm_machine_timer_update"
    " AFTER UPDATE OF status, deadline_at, dispatch_due_at ON state_machines"
    f" WHEN {CHANGED} BEGIN"
    f" DELETE FROM machine_timers WHERE machine_id = NEW.id AND NOT ({NEW_ARMED});"
    f" {_ARM_SQLITE} END",
]
DROP = [
    "DROP TRIGGER fsm_machine_timer_update ON state_machines",
    "DROP TRIGGER fsm_machine_timer_insert ON state_machines",
    "DROP FUNCTION fsm_machine_timer()",
]


def upgrade() -> None:
    op.create_table(
        "machine_timers",
        sa.Column(
            "machine_id",
            sa.Uuid,
            sa.ForeignKey("state_machines.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("deadline_at", sa.DateTime(timezone=True)),
        sa.Column("dispatch_due_at", sa.DateTime(timezone=True)),
    )
    op.create_index(
        "idx_timers_deadline",
        "machine_timers",
        ["deadline_at"],
        postgresql_where=sa.text("dispatch_due_at IS NULL"),
        sqlite_where=sa.text("dispatch_due_at IS NULL"),
    )
    op.create_index(
        "idx_timers_dispatch_due",
        "machine_timers",
        ["dispatch_due_at"],
        postgresql_where=sa.text("dispatch_due_at IS NOT NULL"),
        sqlite_where=sa.text("dispatch_due_at IS NOT NULL"),
    )
    op.execute(
        "INSERT INTO machine_timers (machine_id, deadline_at, dispatch_due_at)"
        f" SELECT id, deadline_at, dispatch_due_at FROM state_machines WHERE {ARMED}"
    )
    op.drop_index("idx_machines_deadline", table_name="state_machines")
    op.drop_index("idx_machines_dispatch_due", table_name="state_machines")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE state_machines SET (fillfactor = 80)")
        op.execute(FUNCTION_POSTGRESQL)
        for statement in TRIGGERS_POSTGRESQL:
            op.execute(statement)
    else:
        for statement in TRIGGERS_SQLITE:
            op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for statement in DROP:
            op.execute(statement)
        op.execute("ALTER TABLE state_machines RESET (fillfactor)")
    else:
        for statement in DROP[:2]:
            op.execute(statement.removesuffix(" ON state_machines"))
    op.create_index(
        "idx_machines_deadline",
        "state_machines",
        ["deadline_at"],
        postgresql_where=RUNNING,
        sqlite_where=RUNNING,
    )
    op.create_index(
        "idx_machines_dispatch_due",
        "state_machines",
        ["dispatch_due_at"],
        postgresql_where=RUNNING,
        sqlite_where=RUNNING,
    )
    op.drop_table("machine_timers")
