"""The Python client: start, inspect and command machines (the CLI runs on it too).

`Client` works on the parts it is given (fsm_celery.wiring builds them from settings); the
module's functions use the process's default client, built from FSM_* environment settings on
first use.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any
from uuid import UUID

from fsm_celery.core.admin import Action, Command
from fsm_celery.core.loader import definition_files, load_all
from fsm_celery.core.usage import Budget
from fsm_celery.engine import MachineEngine, Next
from fsm_celery.engine.schedules import ScheduleInfo
from fsm_celery.exceptions import InvalidActor, InvalidAgentId, MachineNotFound
from fsm_celery.store import queries as q

log = logging.getLogger(__name__)
ACTOR_CHARS = 100  # state_transitions.actor
Enqueue = Callable[[Next], None]


@dataclass(frozen=True)
class MachineInfo:
    """A machine instance as the API shows it."""

    id: UUID
    type: str
    agent_type: str
    agent_id: UUID | None
    current_state: str
    status: str
    context: dict[str, Any]
    attempt: int
    github_issue: int | None
    definition_version: int
    deadline_at: datetime | None
    heartbeat_at: datetime | None
    progress: str | None
    tokens_used: int
    cost: float
    budget_tokens: int | None
    budget_cost: float | None
    error: str | None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: q.AnyRow) -> MachineInfo:
        return cls(**{name: getattr(row, name) for name in cls.__dataclass_fields__})

    def to_dict(self) -> dict[str, Any]:
        return _jsonable(asdict(self))


@dataclass(frozen=True)
class TransitionRecord:
    """One history row: the outcome of one attempt (attempt 0 is the start)."""

    attempt: int
    event: str
    from_state: str | None
    to_state: str
    success: bool
    output: dict[str, Any] | None
    error_message: str | None
    duration_ms: int | None
    actor: str | None
    reason: str | None
    progress: str | None
    agent_id: UUID | None
    tokens_used: int
    cost: float
    created_at: datetime

    @classmethod
    def from_row(cls, row: q.AnyRow) -> TransitionRecord:
        return cls(**{name: getattr(row, name) for name in cls.__dataclass_fields__})

    def to_dict(self) -> dict[str, Any]:
        return _jsonable(asdict(self))


class Client:
    """Starts and inspects machines. Entering states is handed to `enqueue` (Celery, normally)."""

    def __init__(
        self,
        engine: MachineEngine,
        enqueue: Enqueue,
        parked: Callable[[int], list[dict[str, str]]] | None = None,
    ) -> None:
        self.engine = engine
        self.enqueue = enqueue
        self._parked = parked

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
        machine_id = first[0].machine_id
        try:
            self.enqueue(first)
        except Exception:
            # The machine is committed with its dispatch due: the scan enters its first
            # state once the broker is back. Raising would invite a caller to start it twice.
            log.warning(
                "machine %s started but not enqueued (the broker is unreachable); the scan "
                "will dispatch it",
                machine_id,
                exc_info=log.isEnabledFor(logging.INFO),  # the traceback with -v
            )
        return machine_id

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
    ) -> MachineInfo:
        """Set the machine's budget (None: no limit); a machine paused over budget resumes."""
        _check_actor(actor)
        mid = _uuid(machine_id)
        self.enqueue(self.engine.admin.set_budget(mid, Budget(tokens=tokens, cost=cost), actor))
        return self.get_machine(mid)

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
            [_jsonable(dict(r._mapping)) for r in runs],
            [_jsonable(dict(r._mapping)) for r in events],
        )

    def agents(self) -> list[dict[str, Any]]:
        """Every agent that ever reported, with its status and when it was last seen."""
        with self.engine.db.connect() as conn:
            rows = q.list_agents_txn(conn)
        return [_jsonable(dict(r._mapping)) for r in rows]

    def _command(self, machine_id: UUID | str, command: Command) -> MachineInfo:
        _check_actor(command.actor)
        mid = _uuid(machine_id)
        self.enqueue(self.engine.admin.command(mid, command))
        return self.get_machine(mid)

    def get_machine(self, machine_id: UUID | str) -> MachineInfo:
        """The machine with that id (MachineNotFound if none)."""
        with self.engine.db.connect() as conn:
            row = q.get_machine_txn(conn, _uuid(machine_id))
        if row is None:
            raise MachineNotFound(str(machine_id))
        return MachineInfo.from_row(row)

    def list_machines(
        self,
        *,
        agent_type: str | None = None,
        status: str | None = None,
        machine_type: str | None = None,
        limit: int = 100,
    ) -> list[MachineInfo]:
        """Machines, newest first, filtered by agent type, status and machine type."""
        with self.engine.db.connect() as conn:
            rows = q.list_machines_txn(
                conn, agent_type=agent_type, status=status, machine_type=machine_type, limit=limit
            )
        return [MachineInfo.from_row(r) for r in rows]

    def history(self, machine_id: UUID | str) -> list[TransitionRecord]:
        """The machine's transitions in attempt order (MachineNotFound if no such machine)."""
        mid = _uuid(machine_id)
        with self.engine.db.connect() as conn:
            rows = q.history_txn(conn, mid)
            if not rows and q.get_machine_txn(conn, mid) is None:
                raise MachineNotFound(str(machine_id))
        return [TransitionRecord.from_row(r) for r in rows]

    def stats(self) -> dict[str, Any]:
        """Machines per type and status, and rejected messages per reason."""
        with self.engine.db.connect() as conn:
            machines: dict[str, dict[str, int]] = {}
            for row in q.status_counts_txn(conn):
                machines.setdefault(row.type, {})[row.status] = row.total
            rejected = {row.reason: row.total for row in q.rejection_counts_txn(conn)}
            usage = {
                by: {
                    str(row.key): {
                        "tokens": int(row.tokens or 0),
                        "cost": float(row.cost or 0),
                        "attempts": row.attempts,
                    }
                    for row in q.usage_by_txn(conn, column)
                }
                for by, column in (("by_type", "type"), ("by_agent", "agent_id"))
            }
        return {"machines": machines, "rejected": rejected, "usage": usage}

    def rejected(
        self, machine_id: UUID | str | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        """The latest rejected messages, newest first."""
        mid = _uuid(machine_id) if machine_id is not None else None
        with self.engine.db.connect() as conn:
            rows = q.rejections_txn(conn, mid, limit)
        return [_jsonable(dict(r._mapping)) for r in rows]

    def parked(self, limit: int = 100) -> list[dict[str, str]]:
        """Messages the bridge could neither apply nor record, newest first (dead letters)."""
        return self._parked(limit) if self._parked is not None else []

    def register_agent(self, agent_id: UUID | str, agent_type: str) -> None:
        """Record that the agent was given credentials for the agent type: a status it sends
        claiming another type is refused."""
        with self.engine.db.begin() as conn:
            q.register_agent_txn(
                conn, _agent_uuid(agent_id), agent_type, self.engine.runtime.clock()
            )


def _agent_uuid(value: UUID | str) -> UUID:
    try:
        return value if isinstance(value, UUID) else UUID(value)
    except ValueError:
        raise InvalidAgentId(value) from None


def _uuid(value: UUID | str) -> UUID:
    if isinstance(value, UUID):
        return value
    try:
        return UUID(value)
    except ValueError:
        raise MachineNotFound(value) from None


def _jsonable(data: dict[str, Any]) -> dict[str, Any]:
    return {
        k: (str(v) if isinstance(v, UUID) else v.isoformat() if isinstance(v, datetime) else v)
        for k, v in data.items()
    }


# the process's default client -----------------------------------------------------------


@lru_cache(maxsize=1)
def default_client() -> Client:
    """The client built from FSM_* environment settings on first use."""
    from fsm_celery.config import get_settings
    from fsm_celery.wiring import client

    return client(get_settings())


def start_machine(
    machine_type: str,
    context: Mapping[str, Any] | None = None,
    agent_id: UUID | str | None = None,
    github_issue: int | None = None,
) -> UUID:
    """Start a machine; returns its id."""
    return default_client().start_machine(machine_type, context, agent_id, github_issue)


def get_machine(machine_id: UUID | str) -> MachineInfo:
    """The machine with that id."""
    return default_client().get_machine(machine_id)


def list_machines(
    *,
    agent_type: str | None = None,
    status: str | None = None,
    machine_type: str | None = None,
    limit: int = 100,
) -> list[MachineInfo]:
    """Machines, newest first, filtered by agent type, status and machine type."""
    return default_client().list_machines(
        agent_type=agent_type, status=status, machine_type=machine_type, limit=limit
    )


def history(machine_id: UUID | str) -> list[TransitionRecord]:
    """The machine's transitions in order."""
    return default_client().history(machine_id)


def stats() -> dict[str, Any]:
    """Machines per type and status, rejected messages per reason."""
    return default_client().stats()


def _check_actor(actor: str) -> None:
    """Who acted must fit the history's column (the database would refuse it mid-command)."""
    if len(actor) > ACTOR_CHARS:
        raise InvalidActor(actor, ACTOR_CHARS)
