"""The Python client: start, inspect and command machines (the CLI and the HTTP API run on it;
what it returns is fsm_celery.records').

`Client` works on the parts it is given (fsm_celery.wiring builds them from settings);
fsm_celery.api's functions use the process's default client, built from FSM_* settings.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any
from uuid import UUID

from sqlalchemy import Connection

from fsm_celery.core import github, timeline
from fsm_celery.core.admin import Action, Command
from fsm_celery.core.definition import MachineDefinition, validate
from fsm_celery.core.gate import Choice, Vote
from fsm_celery.core.loader import definition_files, load_all, load_file, parse_definition
from fsm_celery.core.messages import INT32_MAX, unstorable
from fsm_celery.core.usage import Budget
from fsm_celery.engine import Handoff, MachineEngine, Next
from fsm_celery.engine.approvals import ADMIN, Authority
from fsm_celery.engine.github import Delivered
from fsm_celery.engine.replays import MachineReplay
from fsm_celery.engine.retention import Outcome
from fsm_celery.engine.schedules import ScheduleInfo
from fsm_celery.exceptions import (
    AgentNotFound,
    AmbiguousMachineId,
    DefinitionError,
    FsmError,
    InvalidActor,
    InvalidAgentId,
    InvalidDecision,
    MachineNotFound,
    StepNotFound,
    UnknownMachineType,
)
from fsm_celery.records import (
    AgentInfo,
    BulkResult,
    DefinitionVersion,
    FanOutProgress,
    MachineInfo,
    Rewinding,
    TransitionRecord,
    TreeNode,
    jsonable,
    notification_view,
)
from fsm_celery.store import agents as agent_store
from fsm_celery.store import credentials as credential_store
from fsm_celery.store import gates as gate_store
from fsm_celery.store import notify as notify_store
from fsm_celery.store import queries as q
from fsm_celery.store import reads
from fsm_celery.store import signals as signal_store
from fsm_celery.store import slots as slot_store
from fsm_celery.store.credentials import ISSUED
from fsm_celery.store.partitions import Partition
from fsm_celery.store.reads import Cursor, MachineFilter

log = logging.getLogger(__name__)
ACTOR_CHARS = 100  # state_transitions.actor
MIN_PREFIX = 4  # hex digits of an id that may name a machine (git's shortest commit prefix)
CANDIDATES = 10  # ids an ambiguous prefix's error lists at most
TREE_SHOWN = 10  # children a tree lists of each machine; the others it counts by status
TREE_MOST = 200  # machines a tree lists at most
FAN_OUTS = 20  # a machine's latest fan-outs shown (a loop may enter a fan-out state often)
OUTSIDE_EVENTS = ("pull_request", "check_suite", "workflow_run")  # core.github.outside_event


class Client:
    """Starts and inspects machines. Entering states is handed to `enqueue` (Celery, normally)."""

    def __init__(
        self,
        engine: MachineEngine,
        enqueue: Handoff,
        parked: Callable[[int], list[dict[str, str]]] | None = None,
        revoke_user: Callable[[UUID], bool] | None = None,
    ) -> None:
        self.engine = engine
        self.enqueue = enqueue
        self._parked = parked
        self._revoke_user = revoke_user  # deletes an agent's Redis user (channel.acl)

    def load_definitions(self, path: str | None = None) -> list[tuple[str, int, bool]]:
        """Load the YAML definitions at path (file or folder): (type, version, created)."""
        files = definition_files(path or self.engine.settings.definitions)
        return self.engine.catalog.load(load_all(files))

    def start_machine(
        self,
        machine_type: str,
        context: Mapping[str, Any] | None = None,
        agent_id: UUID | str | None = None,
        github_issue: int | None = None,
    ) -> UUID:
        """Start a machine of the type; returns its id once its first state is enqueued."""
        first = self.engine.admin.start(machine_type, context, agent_id, github_issue)
        self._hand_on(first)
        return first[0].machine_id

    def _hand_on(self, started: Next) -> None:
        """Enqueue the first states of machines just started; when the broker is down, leave
        them to the scan: the machines are committed with their dispatch due, and raising would
        invite a caller to start them twice."""
        try:
            self.enqueue(started)
        except Exception:
            log.warning(
                "machine %s started but not enqueued (the broker is unreachable); the scan "
                "will dispatch it",
                ", ".join(str(step.machine_id) for step in started),
                exc_info=log.isEnabledFor(logging.INFO),  # the traceback with -v
            )

    def github_delivery(self, delivery: str, event: str, payload: Any) -> Delivered:
        """Carry out a GitHub webhook delivery (its signature already checked): start the
        machine an issue asks for, or decide at its gate as an approver's comment says; once
        however often the delivery comes."""
        settings = self.engine.settings
        action = payload.get("action") if isinstance(payload, dict) else None
        if not isinstance(action, str) or unstorable(action) is not None:
            action = None
        if event == "issue_comment":  # an approver's /approve or /reject
            decision = github.comment_decision(event, payload)
            done = self.engine.github.comment(delivery, event, decision, action)
        elif event in OUTSIDE_EVENTS:  # an event for machines waiting for it
            outside = github.outside_event(event, payload, fork_heads=settings.github_fork_heads)
            signals = self.engine.signals
            done = self.engine.github.outside(delivery, event, outside, action, signals)
        else:
            wanted = github.decide(
                event,
                payload,
                build_type=settings.github_build_type,
                bug_type=settings.github_bug_type,
                bug_label=settings.github_bug_label,
            )
            done = self.engine.github.deliver(delivery, event, wanted, action)
        if done.next:
            self._hand_on(done.next)
        return done

    def pause(self, machine_id: UUID | str, actor: str, reason: str = "") -> MachineInfo:
        """Stop dispatching: acks for the running attempt will be refused."""
        return self._command(machine_id, Command(Action.PAUSE, actor, reason))

    def resume(self, machine_id: UUID | str, actor: str, reason: str = "") -> MachineInfo:
        """Enter the paused machine's current state again, as a new attempt."""
        return self._command(machine_id, Command(Action.RESUME, actor, reason))

    def cancel(self, machine_id: UUID | str, actor: str, reason: str = "") -> MachineInfo:
        """End the machine for good; its state stays where it was."""
        return self._command(machine_id, Command(Action.CANCEL, actor, reason))

    def retry(self, machine_id: UUID | str, actor: str, reason: str = "") -> MachineInfo:
        """Enter the current state again now (a failed machine: the state that failed)."""
        return self._command(machine_id, Command(Action.RETRY, actor, reason))

    def force(
        self, machine_id: UUID | str, target: str, actor: str, reason: str = ""
    ) -> MachineInfo:
        """Move the machine to the named state, whatever its status."""
        return self._command(machine_id, Command(Action.FORCE, actor, reason, target))

    def set_budget(
        self,
        machine_id: UUID | str,
        actor: str,
        tokens: int | None = None,
        cost: float | None = None,
        reason: str = "",
    ) -> MachineInfo:
        """Set the machine's budget (None: no limit), audited with who and why; a machine
        paused over budget resumes."""
        _check_actor(actor)
        mid = self.full_id(machine_id)
        budget = Budget(tokens=tokens, cost=cost)
        self.enqueue(self.engine.admin.set_budget(mid, budget, actor, reason))
        return self.get_machine(mid)

    def budget_changes(self, machine_id: UUID | str) -> list[dict[str, Any]]:
        """Who changed the machine's budget, when, why, and from what."""
        with self.engine.db.connect() as conn:
            rows = q.budget_changes_txn(conn, _full_id_txn(conn, machine_id))
        return [jsonable(dict(r._mapping)) for r in rows]

    def schedules(self) -> list[ScheduleInfo]:
        """Every schedule of the loaded definitions (retired ones too), with its latest run."""
        return self.engine.schedules.all()

    def schedule(self, ref: str) -> ScheduleInfo:
        """One schedule (TYPE/NAME, or TYPE when the type has one), with its latest run."""
        return self.engine.schedules.one(ref)

    def pause_schedule(self, ref: str, actor: str, reason: str = "") -> ScheduleInfo:
        """Start no machine on the schedule's ticks (TYPE/NAME, or TYPE) until it is resumed."""
        return self.engine.schedules.pause(ref, actor, reason)

    def resume_schedule(self, ref: str, actor: str, reason: str = "") -> ScheduleInfo:
        """Start machines on the schedule's ticks again, from the next one on."""
        return self.engine.schedules.resume(ref, actor, reason)

    def trigger_schedule(self, ref: str, actor: str, reason: str = "") -> UUID:
        """Start the schedule's machine now; returns its id."""
        first = self.engine.schedules.trigger(ref, actor, reason)
        self.enqueue(first)
        return first[0].machine_id

    def schedule_history(
        self, ref: str, limit: int = 20
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The schedule's latest runs (tick, outcome, machine) and changes (who, what, why)."""
        runs, events = self.engine.schedules.history(ref, limit)
        return (
            [jsonable(dict(r._mapping)) for r in runs],
            [jsonable(dict(r._mapping)) for r in events],
        )

    def decide(
        self,
        machine_id: UUID | str,
        decision: str,
        actor: str,
        *,
        fields: Mapping[str, Any] | None = None,
        comment: str = "",
        via: str = "client",
        authority: Authority = ADMIN,
        attempt: int | None = None,
    ) -> dict[str, Any]:
        """Record a person's decision, approve or reject, at the machine's approval gate (with
        the gate's form filled in as `fields`); a verdict moves the machine on. A person's
        second decision at a gate changes nothing (`recorded` false: their first stands)."""
        try:
            choice = Choice(decision)
        except ValueError:
            raise InvalidDecision(
                str(machine_id), f"{decision!r} is not approve or reject"
            ) from None
        mid = self.full_id(machine_id)
        vote = Vote(actor, choice, dict(fields or {}), comment, via)
        decided = self.engine.approvals.decide(mid, vote, authority, attempt)
        self._hand_on(decided.next)
        return jsonable({k: v for k, v in asdict(decided).items() if k != "next"})

    def approvals(self, limit: int = 100, machine_type: str | None = None) -> list[dict[str, Any]]:
        """The approval gates waiting for people, soonest deadline first."""
        with self.engine.db.connect() as conn:
            rows = gate_store.pending_txn(conn, limit, machine_type)
        return [jsonable(dict(r._mapping)) for r in rows]

    def decisions(self, machine_id: UUID | str) -> dict[str, list[dict[str, Any]]]:
        """The machine's approval gates and the decisions made at them, oldest first."""
        with self.engine.db.connect() as conn:
            mid = _full_id_txn(conn, machine_id)
            gates = gate_store.machine_gates_txn(conn, mid)
            made = gate_store.machine_decisions_txn(conn, mid)
        return {
            "gates": [jsonable(dict(r._mapping)) for r in gates],
            "decisions": [jsonable(dict(r._mapping)) for r in made],
        }

    def send_event(
        self,
        machine_id: UUID | str,
        name: str,
        payload: Mapping[str, Any] | None = None,
        sender: str = "client",
        *,
        via: str = "client",
        key: str | None = None,
    ) -> dict[str, Any]:
        """Send the machine an outside event: applied at once when it waits for it, else kept
        until it enters the state that does (`outcome`: applied, kept, or duplicate, when
        `key` was sent before)."""
        mid = self.full_id(machine_id)
        done = self.engine.signals.send(mid, name, dict(payload or {}), sender, via, key)
        self._hand_on(done.next)
        return jsonable({k: v for k, v in asdict(done).items() if k != "next"})

    def events(self, machine_id: UUID | str) -> list[dict[str, Any]]:
        """The outside events sent to the machine, oldest first: kept, applied or refused."""
        with self.engine.db.connect() as conn:
            rows = signal_store.machine_events_txn(conn, _full_id_txn(conn, machine_id))
        return [jsonable(dict(r._mapping)) for r in rows]

    def agents(self) -> list[dict[str, Any]]:
        """Every agent that ever reported, with its status and when it was last seen."""
        with self.engine.db.connect() as conn:
            rows = agent_store.list_agents_txn(conn)
        return [jsonable(dict(r._mapping)) for r in rows]

    def _command(self, machine_id: UUID | str, command: Command) -> MachineInfo:
        _check_actor(command.actor)
        mid = self.full_id(machine_id)
        self.enqueue(self.engine.admin.command(mid, command))
        return self.get_machine(mid)

    def full_id(self, machine_id: UUID | str) -> UUID:
        """The id of the machine, given its id or the start of it (at least four hex digits,
        as git takes a commit's: the dashboard shows eight); MachineNotFound when no machine's
        id starts so, AmbiguousMachineId when more than one does."""
        exact = _exact_id(machine_id)
        if exact is not None:  # a whole id needs no query
            return exact
        with self.engine.db.connect() as conn:
            return _full_id_txn(conn, machine_id)

    def get_machine(self, machine_id: UUID | str) -> MachineInfo:
        """The machine with that id or id prefix (MachineNotFound if none)."""
        with self.engine.db.connect() as conn:
            row = q.get_machine_txn(conn, _full_id_txn(conn, machine_id))
            if row is None:
                raise MachineNotFound(str(machine_id))
            position = None
            if row.queued_at is not None and row.status == "running":
                position = slot_store.queue_position_txn(conn, row)
        return MachineInfo.from_row(row, position)

    def list_machines(
        self,
        *,
        agent_type: str | None = None,
        status: str | None = None,
        machine_type: str | None = None,
        parent: UUID | str | None = None,
        limit: int = 100,
    ) -> list[MachineInfo]:
        """Machines, newest first, filtered by agent type, status, machine type and parent."""
        where = MachineFilter(
            status=status,
            machine_type=machine_type,
            agent_type=agent_type,
            parent_id=self.full_id(parent) if parent is not None else None,
        )
        return self.find_machines(where, limit)

    def children(
        self, machine_id: UUID | str, limit: int = 100, after: Cursor | None = None
    ) -> list[MachineInfo]:
        """A page of the machine's children (of every attempt), newest first, after the
        cursor (MachineNotFound if no such machine)."""
        with self.engine.db.connect() as conn:
            mid = _full_id_txn(conn, machine_id)
            rows = reads.find_machines_txn(conn, MachineFilter(parent_id=mid), limit, after)
            if not rows and q.get_machine_txn(conn, mid) is None:
                raise MachineNotFound(str(machine_id))
        return [MachineInfo.from_row(r) for r in rows]

    def tree(
        self, machine_id: UUID | str, shown: int = TREE_SHOWN, most: int = TREE_MOST
    ) -> TreeNode:
        """The machine and its descendants, each with its first `shown` children listed and
        the others counted by status; `most` machines in all."""
        with self.engine.db.connect() as conn:
            found = reads.tree_txn(conn, _full_id_txn(conn, machine_id), shown, most)
        if found is None:
            raise MachineNotFound(str(machine_id))
        return TreeNode.of(found)

    def fan_outs(self, machine_id: UUID | str, limit: int = FAN_OUTS) -> list[FanOutProgress]:
        """The machine's latest fan-outs, newest first: how many children, and how they stand
        (done, failed, running, waiting, cancelled)."""
        with self.engine.db.connect() as conn:
            mid = _full_id_txn(conn, machine_id)
            rows = reads.fan_outs_txn(conn, mid, limit)
            if not rows and q.get_machine_txn(conn, mid) is None:
                raise MachineNotFound(str(machine_id))
            slots = reads.slot_counts_txn(conn, mid, [r.attempt for r in rows]) if rows else {}
        return [FanOutProgress.from_row(r, slots.get(r.attempt, {})) for r in rows]

    def find_machines(
        self, where: MachineFilter, limit: int = 50, after: Cursor | None = None
    ) -> list[MachineInfo]:
        """A page of the machines the filter selects, newest first, after the cursor."""
        with self.engine.db.connect() as conn:
            rows = reads.find_machines_txn(conn, where, limit, after)
        return [MachineInfo.from_row(r) for r in rows]

    def count_machines(self, where: MachineFilter) -> dict[str, int]:
        """How many machines the filter selects, by status."""
        with self.engine.db.connect() as conn:
            return reads.count_machines_txn(conn, where)

    def bulk(
        self, action: Action, where: MachineFilter, actor: str, reason: str = "", limit: int = 100
    ) -> list[BulkResult]:
        """Command every machine the filter selects (newest first, at most limit), each in its
        own transaction: one refused does not stop the others."""
        _check_actor(actor)
        with self.engine.db.connect() as conn:
            ids = reads.machine_ids_txn(conn, where, limit)
        results = []
        for mid in ids:
            try:
                info = self._command(mid, Command(action, actor, reason))
            except FsmError as exc:
                results.append(BulkResult(mid, False, error=str(exc)))
            else:
                results.append(BulkResult(mid, True, status=info.status))
        return results

    def agents_at_work(self) -> list[AgentInfo]:
        """Every agent with its status, when it was last seen, and what it works on now."""
        with self.engine.db.connect() as conn:
            listed, work = reads.agents_at_work_txn(conn)
        doing: dict[UUID, list[dict[str, Any]]] = {}
        for w in work:
            doing.setdefault(w.agent_id, []).append(jsonable(dict(w._mapping)))
        return [
            AgentInfo(
                id=a.id,
                agent_type=a.agent_type,
                status=a.status,
                concurrency=a.concurrency,
                running=a.running,
                hostname=a.hostname,
                started_at=a.started_at,
                last_seen_at=a.last_seen_at,
                working_on=doing.get(a.id, []),
            )
            for a in listed
        ]

    def machine_types(self) -> list[str]:
        """Every machine type with a loaded definition."""
        with self.engine.db.connect() as conn:
            return reads.machine_types_txn(conn)

    def agent_types(self) -> list[str]:
        """Every agent type a loaded definition names."""
        with self.engine.db.connect() as conn:
            return reads.agent_types_txn(conn)

    def definition_versions(self) -> list[dict[str, Any]]:
        """Every stored version of every machine type (newest first per type)."""
        with self.engine.db.connect() as conn:
            rows = reads.definition_versions_txn(conn)
        return [jsonable(dict(r._mapping)) for r in rows]

    def definition(self, machine_type: str, version: int | None = None) -> DefinitionVersion:
        """One version of a machine type (the latest by default), and its checker's problems.
        A child's inline type (`type.STATE[.branch]`) is part of its root type's version."""
        root_type = machine_type.split(".", 1)[0]
        with self.engine.db.connect() as conn:
            row = reads.definition_body_txn(conn, root_type, version)
            versions = reads.versions_of_txn(conn, root_type)
        if row is None:
            raise UnknownMachineType(machine_type, self.machine_types())
        source = f"{root_type} v{row.version}"
        definition = parse_definition(row.body, source, check=False)
        try:  # checked when it was loaded; a newer checker may find more
            validate(definition, source)
            problems: list[str] = []
        except DefinitionError as exc:
            problems = [str(p) for p in exc.problems]
        if machine_type != root_type:
            try:
                definition = definition.at(machine_type)
            except (KeyError, IndexError, AssertionError):  # a place the definition has not
                raise UnknownMachineType(machine_type, self.machine_types()) from None
        return DefinitionVersion(
            machine_type, row.version, row.created_at, definition, problems, versions
        )

    def history(
        self,
        machine_id: UUID | str,
        *,
        context: bool = False,
        after: int = -1,
        limit: int | None = None,
    ) -> list[TransitionRecord]:
        """The machine's transitions in attempt order (MachineNotFound if no such machine);
        with `context`, each with what it changed in the machine's context and the context
        after it, reconstructed from the changes the history records (core.timeline). Only
        the steps after step `after`, `limit` of them at most (a page: the contexts of the
        steps before it are folded, never kept)."""
        with self.engine.db.connect() as conn:
            mid = _full_id_txn(conn, machine_id)
            rows = q.history_txn(conn, mid)
            if not rows and q.get_machine_txn(conn, mid) is None:
                raise MachineNotFound(str(machine_id))
        first = next((i for i, r in enumerate(rows) if r.attempt > after), len(rows))
        last = len(rows) if limit is None else min(len(rows), first + limit)
        if not context:
            return [TransitionRecord.from_row(r) for r in rows[first:last]]
        records = []
        state: dict[str, Any] = {}
        sure = True
        for i, row in enumerate(rows[:last]):
            delta = row.context_delta
            sure = sure and delta is not None
            state = timeline.apply(state, delta)
            if i >= first:
                records.append(
                    TransitionRecord.from_row(row, delta or {}, state if sure else None, sure)
                )
        return records

    def rewind(
        self,
        machine_id: UUID | str,
        step: int,
        actor: str,
        reason: str = "",
        edits: Mapping[str, Any] | None = None,
    ) -> Rewinding:
        """Put the machine back at the state it was in after `step`, with the context it had
        then and `edits` over it, as a new attempt (whatever its status); recorded as a
        `rewind` with who and why, the history before it kept: that row's step, and the
        machine."""
        _check_actor(actor)
        mid = self.full_id(machine_id)
        rewound = self.engine.rewind.rewind(mid, step, actor, reason, edits)
        self.enqueue(rewound.next)
        return Rewinding(rewound.step, self.get_machine(mid))

    def fork(
        self,
        machine_id: UUID | str,
        step: int,
        actor: str,
        reason: str = "",
        edits: Mapping[str, Any] | None = None,
    ) -> UUID:
        """Start a new machine at the state `machine_id` was in after `step`, with the context
        it had then and `edits` over it, linked to it (forked_from, forked_at); the source is
        untouched. Returns the new machine's id once its first state is enqueued."""
        _check_actor(actor)
        first = self.engine.fork.fork(self.full_id(machine_id), step, actor, reason, edits)
        self._hand_on([first])
        return first.machine_id

    def replay(
        self,
        machine_id: UUID | str,
        *,
        definition: MachineDefinition | str | Path | None = None,
        version: int | None = None,
    ) -> MachineReplay:
        """Run the machine's recorded history again through the core against a definition (a
        file's, one given, or its type's stored `version`; its type's newest by default),
        calling no agent: step by step, whether it takes the same path, where it diverges and
        why (fsm_celery.core.replay). Only reads."""
        mid = self.full_id(machine_id)
        if definition is None:
            return self.engine.replays.machine(mid, version=version)
        found, against = _definition_of(definition)
        return self.engine.replays.machine(mid, found, against=against)

    def replay_last(
        self, definition: MachineDefinition | str | Path, count: int
    ) -> list[MachineReplay]:
        """Replay the last `count` machines of the definition's type that ended (newest first)
        against it: what a new version would do to real runs before it is loaded."""
        found, against = _definition_of(definition)
        return self.engine.replays.last(found, count, against)

    def forks(self, machine_id: UUID | str) -> list[MachineInfo]:
        """The machines forked from this one, oldest first."""
        with self.engine.db.connect() as conn:
            rows = q.forks_txn(conn, _full_id_txn(conn, machine_id))
        return [MachineInfo.from_row(r) for r in rows]

    def context_at(self, machine_id: UUID | str, step: int | None = None) -> dict[str, Any]:
        """The machine's context as it was after a step (its latest when none is given),
        reconstructed from the changes the history records: the step, its event and states,
        and the context (None for a machine whose early history kept no changes)."""
        with self.engine.db.connect() as conn:
            mid = _full_id_txn(conn, machine_id)
            rows = q.context_deltas_txn(conn, mid, INT32_MAX if step is None else step)
            if not rows and q.get_machine_txn(conn, mid) is None:
                raise MachineNotFound(str(machine_id))
        if not rows or (step is not None and rows[-1].attempt != step):
            raise StepNotFound(str(mid), step, rows[-1].attempt if rows else None)
        last = rows[-1]
        return {
            "machine_id": str(mid),
            "step": last.attempt,
            "event": last.event,
            "from_state": last.from_state,
            "state": last.to_state,
            "context": timeline.context_at(r.context_delta for r in rows),
        }

    def notifications(self, machine_id: UUID | str, *, admin: bool = False) -> list[dict[str, Any]]:
        """The machine's notifications: where, whether delivered, tries, the last error; the
        receivers' paths and answers only for an admin (records.notification_view)."""
        with self.engine.db.connect() as conn:
            rows = notify_store.of_machine_txn(conn, _full_id_txn(conn, machine_id))
        return [notification_view(jsonable(dict(r._mapping)), admin=admin) for r in rows]

    def stats(self) -> dict[str, Any]:
        """Machines by status, type and agent type; attempts per state (success rate, p50 and
        p95 durations); completion rate per type; usage per type and agent; rejections."""
        return self.engine.stats.read()

    def rejected(
        self, machine_id: UUID | str | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        """The latest rejected messages, newest first."""
        with self.engine.db.connect() as conn:
            mid = _full_id_txn(conn, machine_id) if machine_id is not None else None
            rows = q.rejections_txn(conn, mid, limit)
        return [jsonable(dict(r._mapping)) for r in rows]

    def history_months(self) -> dict[str, list[Partition]]:
        """The monthly partitions of the history and of the rejected messages, oldest first
        (PostgreSQL; none on SQLite)."""
        return self.engine.retention.months()

    def archive_history(
        self,
        retention_days: float | None = None,
        archive: str | None = None,
        dry_run: bool = False,
    ) -> list[Outcome]:
        """Run the history's retention now (FSM_HISTORY_RETENTION_DAYS, FSM_HISTORY_ARCHIVE,
        unless given): the months ahead made, those past it archived and removed, or, in a
        dry run, listed."""
        return self.engine.retention.run(retention_days, archive, dry_run)

    def parked(self, limit: int = 100) -> list[dict[str, str]]:
        """Messages the bridge could neither apply nor record, newest first (dead letters)."""
        return self._parked(limit) if self._parked is not None else []

    def register_agent(
        self,
        agent_id: UUID | str,
        agent_type: str,
        acl_rules: list[str] | None = None,
        actor: str = "cli",
    ) -> None:
        """Record that the agent was given credentials for the agent type: a status it sends
        claiming another type is refused; with its Redis user's rules (the password hashed),
        which the bridge creates again on a Redis that lost them (channel.acl.restore_users)."""
        with self.engine.db.begin() as conn:
            agent_store.register_agent_txn(
                conn, _agent_uuid(agent_id), agent_type, self.engine.runtime.clock(), acl_rules
            )
            if acl_rules is not None:
                credential_store.record_txn(conn, _agent_uuid(agent_id), ISSUED, actor, "")

    def revoke_agent(self, agent_id: UUID | str, actor: str, reason: str = "") -> bool:
        """Revoke the agent's Redis credentials, audited: its rules forgotten (the bridge no
        longer creates its user again), no machine assigned to it, its Redis user deleted and
        the connections it opened closed; whether Redis had its user (AgentNotFound when the
        deployment never knew the agent)."""
        _check_actor(actor)
        aid = _agent_uuid(agent_id)
        with self.engine.db.begin() as conn:
            if not credential_store.revoke_txn(conn, aid, actor, reason):
                raise AgentNotFound(str(aid))
        return self._revoke_user(aid) if self._revoke_user is not None else False

    def credential_events(self, agent_id: UUID | str) -> list[dict[str, Any]]:
        """Who issued and who revoked the agent's credentials, when and why, oldest first."""
        with self.engine.db.connect() as conn:
            rows = credential_store.events_txn(conn, _agent_uuid(agent_id))
        return [jsonable(dict(r._mapping)) for r in rows]


def _agent_uuid(value: UUID | str) -> UUID:
    try:
        return value if isinstance(value, UUID) else UUID(value)
    except ValueError:
        raise InvalidAgentId(value) from None


def _exact_id(value: UUID | str) -> UUID | None:
    """The value as a whole id, or None (a prefix, or not an id at all)."""
    if isinstance(value, UUID):
        return value
    try:
        return UUID(value.strip())
    except ValueError:
        return None


def _full_id_txn(conn: Connection, value: UUID | str) -> UUID:
    """A machine's id from its id or an unambiguous start of it (see Client.full_id)."""
    exact = _exact_id(value)
    if exact is not None:
        return exact
    given = str(value)  # a str: a UUID is exact
    text = given.strip()
    if reads.id_range(text) is None:
        raise MachineNotFound(given)
    if len(text.replace("-", "")) < MIN_PREFIX:
        raise MachineNotFound(given, f": give its full id or at least {MIN_PREFIX} hex digits")
    found = reads.machine_ids_starting_txn(conn, text, CANDIDATES + 1)
    if not found:
        raise MachineNotFound(given)
    if len(found) > 1:
        shown = [str(mid) for mid in found[:CANDIDATES]]
        raise AmbiguousMachineId(given, shown, more=len(found) > CANDIDATES)
    return found[0]


def _definition_of(definition: MachineDefinition | str | Path) -> tuple[MachineDefinition, str]:
    """A definition given, or read from its file (DefinitionError naming what is wrong), and
    how a replay names it."""
    if isinstance(definition, MachineDefinition):
        return definition, f"{definition.type} (given)"
    return load_file(definition), str(definition)


def _check_actor(actor: str) -> None:
    """Who acted must fit the history's column (the database would refuse it mid-command)."""
    if len(actor) > ACTOR_CHARS:
        raise InvalidActor(actor, ACTOR_CHARS)
