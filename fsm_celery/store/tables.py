"""The schema. The seed's three tables keep their names and columns; the engine's are added."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    UniqueConstraint,
    Uuid,
)

from fsm_celery.store.columns import (
    TYPE_CHARS,
    BigId,
    Json,
    at,
    created,
    flag,
    machine_ref,
    partial,
    serial,
    tally,
    updated,
    usage,
    why,
    zero,
)

metadata = MetaData()


definitions = Table(
    "state_machine_definitions",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("type", String(50), nullable=False),
    Column("agent_type", String(10), nullable=False),
    Column("description", Text),
    Column("states", Json, nullable=False),
    Column("initial_state", String(50), nullable=False),
    created(),
    # engine additions: a type has many versions; a running machine keeps its own
    Column("version", Integer, nullable=False),
    Column("digest", String(64), nullable=False),
    Column("body", Json, nullable=False),
    UniqueConstraint("type", "version", name="uq_definitions_type_version"),
)


machines = Table(
    "state_machines",
    metadata,
    Column("id", Uuid, primary_key=True),
    Column("type", String(TYPE_CHARS), nullable=False),
    Column("agent_type", String(10), nullable=False),
    Column("current_state", String(50), nullable=False),
    Column("context", Json, nullable=False),
    Column("status", String(20), nullable=False, server_default="running"),
    Column("github_issue", Integer),
    created(),
    updated(),
    # engine additions
    Column("definition_version", Integer, nullable=False),
    Column("agent_id", Uuid),
    zero("attempt"),
    zero("state_retries"),
    at("entered_at"),
    at("deadline_at"),
    at("dispatch_due_at"),
    Column("error", Text),
    at("heartbeat_at"),
    Column("progress", Text),
    flag("agent_pinned"),
    *usage(),
    Column("budget_tokens", BigInteger),
    Column("budget_cost", Float),
    zero("handbacks"),
    zero("corrections"),  # answers of the current attempt refused (fsm_celery.core.correction)
    # a child of a fan-out: its parent, the parent's attempt that started it, its slot there
    # (a branch's position, a map item's index) and the branch's name; never changed once
    # written, so read without a lock (store.postgres locks a machine's ancestors first)
    Column("parent_id", Uuid),
    Column("parent_attempt", Integer),
    Column("slot", Integer),
    Column("branch", String(50)),
    Column("root_id", Uuid),
    Column("depth", SmallInteger, nullable=False, server_default="0"),
    Column("on_parent_cancel", String(8)),
    # waiting for a slot of its agent type since then (agent_type_slots): not dispatched, no
    # deadline running; entered in arrival order as slots free
    at("queued_at"),
    Index("idx_machines_agent", "agent_type", "status"),
    Index("idx_machines_parent", "parent_id", "parent_attempt"),
    Index("idx_machines_root", "root_id"),
    partial("idx_machines_queued", "agent_type", "queued_at", where="queued_at IS NOT NULL"),
    Index("idx_machines_issue", "github_issue"),
    Index("idx_machines_type_status", "type", "status"),
    Index("idx_machines_type_created", "type", "created_at"),
    Index("idx_machines_agent_created", "agent_type", "status", "created_at"),
    # the dashboard's lists, newest first, and what each agent works on now
    Index("idx_machines_created", "created_at", "id"),
    Index("idx_machines_status_created", "status", "created_at"),
    Index("idx_machines_agent_id_created", "agent_id", "created_at"),
    partial("idx_machines_at_work", "agent_id", where="status IN ('running', 'paused')"),
    # 0015: a fork, the machine and step it was started from (fsm_celery.engine.travel)
    Column("forked_from", Uuid),
    Column("forked_at", Integer),
    partial("idx_machines_forked_from", "forked_from", where="forked_from IS NOT NULL"),
)

# What the scan looks machines up by: a running machine's deadline, or when its next state is
# due to be entered; one row for each running machine that has either, kept by triggers on
# state_machines (migration 0010), so no writer can forget it. Those two columns are not
# indexed on state_machines, which every transition changes: there, none of the columns a
# transition changes is indexed, so PostgreSQL updates the row in place (a HOT update, with
# the room fillfactor 80 leaves on each page) instead of adding an entry to every index.
machine_timers = Table(
    "machine_timers",
    metadata,
    machine_ref(primary_key=True),
    at("deadline_at"),
    at("dispatch_due_at"),
    partial("idx_timers_deadline", "deadline_at", where="dispatch_due_at IS NULL"),
    partial("idx_timers_dispatch_due", "dispatch_due_at", where="dispatch_due_at IS NOT NULL"),
)

# The history, partitioned by month on PostgreSQL (migration 0018, fsm_celery.store.partitions)
# by its machine's creation time, copied on each row: a machine's rows are then all in one
# partition, which its reads name, and the one-row-per-attempt key holds the partition key as
# PostgreSQL requires of a partitioned table's unique keys (machine_created_at is the machine's,
# fixed: (machine_id, attempt) is unique all the same). On PostgreSQL the primary key is (id,
# machine_created_at) for the same reason; SQLite keeps one table and id as its key. No foreign
# key to state_machines: attaching and detaching a partition would lock state_machines against
# every transition while it waits (SHARE ROW EXCLUSIVE); rows are written only beside their
# machine's, in its transaction, and machines are never deleted.
HISTORY_KEY = ("machine_id", "attempt", "correction", "machine_created_at")
transitions = Table(
    "state_transitions",
    metadata,
    serial(),
    Column("machine_id", Uuid, nullable=False),
    Column("from_state", String(50)),
    Column("to_state", String(50), nullable=False),
    Column("success", Boolean, nullable=False),
    Column("output", Json),
    Column("error_message", Text),
    Column("duration_ms", BigInteger),  # 0008: INTEGER held 24.8 days
    created(),
    # engine additions: one row per attempt, enforced by the database
    Column("attempt", Integer, nullable=False),
    Column("event", String(20), nullable=False),
    Column("actor", String(100)),
    Column("reason", Text),
    Column("progress", Text),
    Column("agent_id", Uuid),
    *usage(),
    # 0014: what the transition changed in the machine's context (fsm_celery.core.timeline),
    # the start row's its starting context: the context at any step, without a snapshot a row
    Column("context_delta", Json),
    # 0016: the kind of a failed transition (core.definition.FailureKind): an agent's failure
    # told from an answer the definition refused, which replay needs (fsm_celery.core.replay)
    Column("failure", String(20)),
    # 0018: the partition key (see above)
    at("machine_created_at", nullable=False),
    # 0022: an answer refused in the attempt (its nth; 0: the attempt's row, one, as the key says)
    zero("correction", SmallInteger),
    Index("idx_transitions_agent", "agent_id"),
    UniqueConstraint(*HISTORY_KEY, name="uq_transitions_machine_attempt"),
    postgresql_partition_by="RANGE (machine_created_at)",
)

rejected_messages = Table(
    "rejected_messages",
    metadata,
    serial(),
    created("received_at"),
    Column("reason", String(32), nullable=False),
    Column("detail", Text, nullable=False),
    Column("machine_id", Uuid),
    Column("state", String(50)),
    Column("attempt", Integer),
    Column("payload", Text, nullable=False),
    Index("idx_rejected_reason", "reason", "received_at"),
    Index("idx_rejected_machine", "machine_id"),
    postgresql_partition_by="RANGE (received_at)",  # 0018: by month; key (id, received_at)
)

agents = Table(
    "agents",
    metadata,
    Column("id", Uuid, primary_key=True),
    Column("agent_type", String(10), nullable=False),
    Column("status", String(20), nullable=False),
    Column("concurrency", Integer, nullable=False),
    Column("running", Integer, nullable=False),
    Column("hostname", String(255)),
    at("started_at", nullable=False),
    at("last_seen_at", nullable=False),
    at("assigned_at"),
    # set by `fsm-celery agents credentials`: the type its Redis ACL user may serve
    Column("registered_type", String(10)),
    # 0017: its Redis ACL user's rules (the password hashed), for the bridge to create it again
    # on a Redis that lost it (a restart without an aclfile, a promoted replica)
    Column("acl_rules", Json),
    Index("idx_agents_type_seen", "agent_type", "status", "last_seen_at"),
)

# 0020: who issued and who revoked an agent's Redis credentials, when and why.
agent_credential_events = Table(
    "agent_credential_events",
    metadata,
    serial(),
    Column("agent_id", Uuid, nullable=False),
    Column("action", String(16), nullable=False),  # issued, revoked
    *why(),
    created(),
    Index("idx_agent_credential_events_agent", "agent_id", "created_at"),
)

# A definition's schedules (synced from it on load); paused is the operators', kept across loads.
schedules = Table(
    "schedules",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("machine_type", String(50), nullable=False),
    Column("name", String(50), nullable=False),
    Column("cron", String(100), nullable=False),
    Column("timezone", String(64), nullable=False),
    Column("context", Json, nullable=False),
    Column("overlap", String(8), nullable=False),
    flag("paused"),
    at("next_run_at", nullable=False),
    at("last_tick_at"),
    Column("last_machine_id", Uuid),
    at("removed_at"),  # no longer in its definition
    created(),
    updated(),
    UniqueConstraint("machine_type", "name", name="uq_schedules_type_name"),
    Index("idx_schedules_due", "next_run_at"),
)

# One row per tick a schedule ran: its primary key is what lets two beats start one machine.
schedule_runs = Table(
    "schedule_runs",
    metadata,
    Column("schedule_id", Integer, ForeignKey("schedules.id"), primary_key=True),
    at("tick_at", primary_key=True),
    Column("outcome", String(16), nullable=False),  # started, skipped, failed
    Column("machine_id", Uuid),
    Column("detail", Text),
    Column("actor", String(100)),  # who triggered it (none: beat)
    created(),
)

# What operators did to schedules (pause, resume, trigger), and what loads changed.
schedule_events = Table(
    "schedule_events",
    metadata,
    serial(),
    Column("schedule_id", Integer, ForeignKey("schedules.id"), nullable=False),
    Column("action", String(16), nullable=False),
    *why(),
    Column("detail", Json),
    created(),
    Index("idx_schedule_events_schedule", "schedule_id", "created_at"),
)

# When a periodic job last ran (the scan: is beat alive?), for `fsm-celery doctor`.
liveness = Table(
    "liveness",
    metadata,
    Column("name", String(50), primary_key=True),
    at("at", nullable=False),
)

# Who changed a machine's budget, when and why (a budget change is not an attempt: no history row).
budget_changes = Table(
    "budget_changes",
    metadata,
    serial(),
    Column("machine_id", Uuid, ForeignKey("state_machines.id"), nullable=False),
    *why(),
    Column("tokens", BigInteger),
    Column("cost", Float),
    Column("previous_tokens", BigInteger),
    Column("previous_cost", Float),
    created(),
    Index("idx_budget_changes_machine", "machine_id"),
)

# GitHub webhook deliveries seen (X-GitHub-Delivery): a redelivery starts nothing twice.
github_deliveries = Table(
    "github_deliveries",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("event", String(50), nullable=False),
    Column("action", String(50)),
    Column("repository", String(200)),
    Column("issue", Integer),
    Column("outcome", String(20), nullable=False),  # started, running, ignored, refused
    Column("machine_id", Uuid),
    created("received_at"),
    Index("idx_github_deliveries_issue", "repository", "issue"),
)

# Outgoing webhooks of machines that ended, written with the transition that ended them and
# delivered by beat's job, retried with backoff (the outbox: a down receiver blocks nothing).
notifications = Table(
    "notifications",
    metadata,
    serial(),
    Column("machine_id", Uuid, nullable=False),
    Column("url", Text, nullable=False),
    Column("event", String(20), nullable=False),
    Column("payload", Json, nullable=False),
    Column("status", String(12), nullable=False),  # pending, delivered, failed
    zero("attempts"),
    at("next_attempt_at", nullable=False),
    Column("last_error", Text),
    created(),
    at("delivered_at"),
    partial("idx_notifications_due", "next_attempt_at", where="status = 'pending'"),
    Index("idx_notifications_machine", "machine_id"),
)

# One row per attempt of a state that started children: what it started and how they stand.
# The join is decided in the transaction that applies a child's last transition, with the
# parent's row locked: these counters are written there, never in Redis (docs/fan-out.md).
fan_outs = Table(
    "fan_outs",
    metadata,
    Column("parent_id", Uuid, ForeignKey("state_machines.id"), primary_key=True),
    Column("attempt", Integer, primary_key=True),
    Column("state", String(50), nullable=False),
    Column("kind", String(10), nullable=False),  # parallel, map, machine
    Column("total", Integer, nullable=False),
    Column("started", Integer, nullable=False),
    zero("succeeded"),
    zero("failed"),
    Column("verdict", String(10), nullable=False),  # pending, met, failed, closed
    at("decided_at"),
    Column("decided_by", Uuid),  # the child whose end decided it
    # once the parent has moved on (by the join, or out of the state another way); a parent
    # paused when its join was decided keeps it open, to join when resumed
    at("closed_at"),
    # what every child of a map starts with besides its slot's input, stored once (0021)
    Column("shared", Json),
    created(),
    partial("idx_fan_outs_open", "parent_id", where="closed_at IS NULL"),
)

# Each child's slot: its starting context (a map's item in it: the list lives here, never in a
# Redis message), the child started for it, and its result or error once it ended. A map item
# not started yet has its row, waiting.
fan_out_items = Table(
    "fan_out_items",
    metadata,
    Column("parent_id", Uuid, primary_key=True),
    Column("attempt", Integer, primary_key=True),
    Column("slot", Integer, primary_key=True),
    # the child's starting context (a map's: its own part, its item in it; see fan_outs.shared)
    Column("input", Json, nullable=False),
    Column("child_id", Uuid),
    Column("status", String(10), nullable=False),  # waiting, running, succeeded, failed, ...
    Column("result", Json),
    Column("error", Text),
)

# Per agent type, across all machines: how much of its work may be in flight (from definitions'
# agent_types: or FSM_AGENT_TYPE_LIMITS; None: no limit) and how much is. The row is locked by a
# transaction that dispatches or ends work of a limited type, so the count never overshoots.
agent_type_slots = Table(
    "agent_type_slots",
    metadata,
    Column("agent_type", String(10), primary_key=True),
    Column("max_in_flight", Integer),
    zero("in_flight"),
)

# Attempts per machine type, state and duration bucket, folded from the history by beat's job
# (fsm_celery.store.rollup), so that statistics never scan the history.
state_stats = Table(
    "state_stats",
    metadata,
    Column("machine_type", String(TYPE_CHARS), primary_key=True),
    Column("state", String(50), primary_key=True),
    Column("bucket", SmallInteger, primary_key=True),
    Column("attempts", BigInteger, nullable=False),
    Column("successes", BigInteger, nullable=False),
    Column("duration_ms", BigInteger, nullable=False),
)

# Attempts, tokens and cost per agent, folded from the history with state_stats.
agent_usage = Table(
    "agent_usage",
    metadata,
    Column("agent_id", Uuid, primary_key=True),
    Column("attempts", BigInteger, nullable=False),
    Column("tokens", BigInteger, nullable=False),
    Column("cost", Float, nullable=False),
)

# Machines counted by type, agent type and status, with their tokens and cost: the statistics
# read these, not the machines. Triggers on state_machines (migrations 0011, 0025) append a
# change for each machine inserted, deleted, moved to another status, type or agent type, or
# whose usage changed (a transition from state to state fires none); beat's fold moves the
# changes into machine_counts, deleting them in the same transaction.
machine_counts = Table("machine_counts", metadata, *tally(key=True, machines=BigInteger))
machine_count_changes = Table(
    "machine_count_changes",
    metadata,
    serial(),
    *tally(key=False, machines=Integer),
)

# How far each fold has read (history ids), and the id it waits to be sure of.
rollups = Table(
    "rollups",
    metadata,
    Column("name", String(50), primary_key=True),
    Column("last_id", BigInteger, nullable=False),
    Column("pending_id", BigInteger),
    Column("pending_snapshot", String(200)),
    updated(),
)

# Approval gates (fsm_celery.core.gate): one row per visit of a machine to an approval state,
# open until its verdict, its deadline, or the machine's leaving the state; a machine paused
# and resumed there keeps its gate (and the decisions made). Its counters are written by the
# transaction that records a decision, with the machine's row locked: a quorum is met once.
approval_gates = Table(
    "approval_gates",
    metadata,
    serial(),
    machine_ref(nullable=False),
    Column("state", String(50), nullable=False),
    Column("attempt", Integer, nullable=False),  # the machine's, while the gate is open
    at("opened_at", nullable=False),
    at("deadline_at", nullable=False),
    zero("approvals"),
    zero("rejections"),
    Column("needed", Integer, nullable=False),  # approvals that open it, when last counted
    # pending, approved, rejected, timed_out, left (forced, cancelled or rewound away)
    Column("verdict", String(10), nullable=False, server_default="pending"),
    at("closed_at"),
    partial("idx_approval_gates_open", "machine_id", unique=True, where="closed_at IS NULL"),
    partial("idx_approval_gates_open_deadline", "deadline_at", "id", where="closed_at IS NULL"),
    Index("idx_approval_gates_machine", "machine_id", "id"),
)

# Each person's decision at a gate: who, through which door, what, and why. One per person and
# gate (the unique key): a decision sent twice is the one decision. An approver's decision is
# their vote; an admin's (or the CLI's) is an override, recorded as such and counted as no vote.
approval_decisions = Table(
    "approval_decisions",
    metadata,
    serial(),
    Column("gate_id", BigId, ForeignKey("approval_gates.id", ondelete="CASCADE"), nullable=False),
    Column("machine_id", Uuid, nullable=False),
    Column("actor", String(200), nullable=False),
    Column("decision", String(10), nullable=False),  # approve, reject
    Column("fields", Json, nullable=False),
    Column("comment", Text, nullable=False, server_default=""),
    Column("via", String(20), nullable=False),  # api, dashboard, cli, client, github
    # an admin's or the CLI's decision: it decided the gate outright and counted as nobody's vote
    flag("override"),
    created(),
    UniqueConstraint("gate_id", "actor", name="uq_approval_decisions_gate_actor"),
    Index("idx_approval_decisions_machine", "machine_id"),
)

# Outside events sent to machines (fsm_celery.core.signal): applied at once to a machine waiting
# for one, else kept (a few per machine and name) until it enters a state that waits for it.
machine_events = Table(
    "machine_events",
    metadata,
    serial(),
    machine_ref(nullable=False),
    Column("name", String(50), nullable=False),
    Column("payload", Json, nullable=False),
    Column("sender", String(100), nullable=False),
    Column("via", String(20), nullable=False),  # api, cli, client, github
    Column("key", String(100)),  # the sender's id for it: sent twice, it is one event
    at("received_at", nullable=False),
    at("consumed_at"),
    Column("attempt", Integer),  # the machine's attempt it decided, once consumed
    Column("outcome", String(10), nullable=False, server_default="kept"),  # kept, applied, refused
    UniqueConstraint("machine_id", "key", name="uq_machine_events_key"),
    partial("idx_machine_events_kept", "machine_id", "name", "id", where="consumed_at IS NULL"),
)
