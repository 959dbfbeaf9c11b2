"""The agent state kind, worked by an agent: its state_task built, routed to an agent (the
machine's own, a live one of the state's type in turn, or the type's stream), and recorded as
sent; over its agent type's bound, queued for a slot (engine/slots.py). A state whose prompt
cannot be rendered fails its attempt, nothing sent."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from uuid import UUID

from sqlalchemy import Connection

from fsm_celery.core.attempt_events import DispatchFailed
from fsm_celery.core.contract import schema_of
from fsm_celery.core.definition import StateDefinition
from fsm_celery.core.messages import StateTask, task_token
from fsm_celery.core.prompt import PromptError, render
from fsm_celery.core.transition import Machine, Rejected, decide
from fsm_celery.engine.kinds.base import Entering
from fsm_celery.engine.runtime import Runtime
from fsm_celery.engine.slots import Slots, ledger_of
from fsm_celery.store import agents as agent_store
from fsm_celery.store import queries as q
from fsm_celery.store.writes import Writes
from fsm_celery.traces import traceparent_for


@dataclass
class Routing:
    """A transaction's part (Writes.parts): per agent type, its live agents in the order they
    get work (read once a transaction), and the agents handed work in it."""

    live: dict[str, deque[UUID]] = field(default_factory=dict)
    assigned: set[UUID] = field(default_factory=set)

    def write(self, conn: Connection, writes: Writes) -> None:
        agent_store.mark_assigned_txn(conn, sorted(self.assigned), writes.now)


class AgentState:
    def __init__(self, runtime: Runtime, slots: Slots) -> None:
        self._rt = runtime
        self._slots = slots

    def enter_txn(self, at: Entering) -> None:
        """Take a slot of the state's agent type (or queue for one), build the state_task,
        route it, and record it as sent (in this transaction)."""
        conn, _, row, definition, state, writes, machine = at
        agent_type = definition.agent_type_of(state)
        bounded = self._slots.bounds.of(conn, agent_type) is not None  # nearly always known
        if bounded and not self._slots.take_txn(conn, row.id, agent_type, writes):
            writes.queue(row)  # over its agent type's bound: waits for a slot
            return
        try:
            task = self._task(row, state, machine, writes.now)
        except PromptError as exc:
            if row.queued_at is not None:
                # taken from the queue, its ancestors perhaps not held here: the scan fails it,
                # taking the locks in their order (a failed child joins its parent)
                ledger_of(writes).unqueued.append(row.id)
                writes.entered.add(row.id)
                return
            event = DispatchFailed(state.name, machine.attempt, f"prompt of {state.name}: {exc}")
            decision = decide(definition, machine, event, self._rt.limits)
            assert not isinstance(decision, Rejected)  # the machine is at that attempt
            writes.transition(row, decision, "dispatch_error")
            return
        sent = writes.out.sent  # nearly always none pending: read, not asked
        sending = (row.id, task.attempt, task.state)
        earlier = sent.where(sending) if sent is not None and sent.pending else None
        where, agent_id = self._route(conn, row, agent_type, writes, earlier)
        writes.dispatch(task, where, agent_id, sent=earlier is not None)

    def _task(
        self, row: q.AnyRow, state: StateDefinition, machine: Machine, now: datetime
    ) -> StateTask:
        settings = self._rt.settings
        return StateTask(
            machine_id=row.id,
            machine_type=row.type,
            state=state.name,
            attempt=machine.attempt,
            context=dict(machine.context),
            prompt=render(state.prompt, machine.context, settings.max_prompt_bytes),
            required_output=list(state.required_output),
            timeout=int(state.timeout_seconds * 1000),
            deadline=now + state.timeout,
            task_token=task_token(settings.token_secrets[0], row.id, state.name, machine.attempt),
            heartbeat_timeout=_ms(state.heartbeat_timeout),
            output_schema=(
                None
                if state.output_schema is None
                else schema_of(state.output_schema, state.required_output)
            ),
            traceparent=traceparent_for(row.id, row.root_id, machine.attempt),
        )

    def _route(
        self,
        conn: Connection,
        row: q.AnyRow,
        agent_type: str,
        writes: Writes,
        earlier: str | None = None,
    ) -> tuple[str, UUID | None]:
        """Where the task goes, and the agent the machine is then assigned to: its agent (while
        its states are of that agent's type, or it is pinned), else a live agent of the state's
        type, else the type's own channel and stream, where any agent of the type may take it.
        A task a failed transaction sent already stays where it went (`earlier`)."""
        own = row.agent_id if row.agent_pinned or agent_type == row.agent_type else None
        if earlier is not None:
            return earlier, own if earlier == agent_type else UUID(earlier)
        since = writes.now - timedelta(seconds=self._rt.settings.agent_liveness_seconds)
        if own is not None and (row.agent_pinned or agent_store.agent_alive_txn(conn, own, since)):
            return str(own), own
        routing = _routing(writes)
        live = routing.live.get(agent_type)
        if live is None:  # once a transaction, however many states it enters
            live = routing.live[agent_type] = deque(
                agent_store.live_agents_txn(conn, agent_type, since)
            )
        if not live:
            return agent_type, own
        chosen = live[0]
        live.rotate(-1)  # round robin, starting with the agent assigned least recently
        routing.assigned.add(chosen)
        return str(chosen), chosen


def _ms(value: timedelta | None) -> int | None:
    return None if value is None else int(value.total_seconds() * 1000)


def _routing(writes: Writes) -> Routing:
    """The transaction's Routing (made now, the first time): its part of Writes.parts."""
    found = writes.parts.get(Routing)
    if found is None:
        found = writes.parts[Routing] = Routing()
    return found
