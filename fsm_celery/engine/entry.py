"""Entering a state: its state_task built, routed to an agent, sent, and recorded as sent.

Every use case that moves a machine on enters the next state through here, in its own
transaction when the state is due now; the fsm.enter_state task enters it in a transaction of
its own when it was handed on.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from uuid import UUID

from sqlalchemy import Connection

from fsm_celery.core.definition import StateDefinition
from fsm_celery.core.messages import StateTask, task_token
from fsm_celery.core.prompt import PromptError, render
from fsm_celery.core.transition import DispatchFailed, Machine, MachineStatus, Rejected, decide
from fsm_celery.engine.notify import outbox_txn
from fsm_celery.engine.ports import Next
from fsm_celery.engine.runtime import Runtime
from fsm_celery.engine.writes import Writes, aware
from fsm_celery.store import queries as q

EARLY = timedelta(milliseconds=50)  # how early a countdown may fire and still enter a state


class Entry:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    def enter(self, machine_id: UUID, attempt: int) -> Next:
        """Enter the attempt's state unless that was done already or it is not due yet (the
        scan enters it when due). A state that cannot be sent fails its attempt; what that
        leads to after a retry delay is returned."""
        writes = Writes(self._rt.clock())
        with self._rt.transaction(writes) as conn:
            row = q.lock_machines_txn(conn, [machine_id]).get(machine_id)
            if row is None or not _awaits_dispatch(row, attempt):
                return []
            if aware(row.dispatch_due_at) > writes.now + EARLY:  # type: ignore[operator]
                return []  # a retry delay is still running
            self.enter_txn(conn, row, writes)
            self.send_and_write(conn, writes)
        return writes.next()

    def enter_due_txn(self, conn: Connection, rows: dict[UUID, q.AnyRow], writes: Writes) -> None:
        """Enter the states the transaction moved machines to that are due now."""
        for mid in writes.due_now():
            self.enter_txn(conn, rows[mid], writes)

    def enter_txn(self, conn: Connection, row: q.AnyRow, writes: Writes) -> None:
        """Build the machine's state_task, route it, and record it as sent (in this txn).

        A state that cannot be sent (its prompt does not render with this context) fails its
        machine at once, recorded with the reason, and nothing is sent (core.transition says
        why).
        """
        definition = self._rt.catalog.version(conn, row.type, row.definition_version)
        machine = writes.machine(row)
        state = definition.state(machine.current_state)
        try:
            task = self._task(row, state, machine, writes.now)
        except PromptError as exc:
            event = DispatchFailed(state.name, machine.attempt, f"prompt of {state.name}: {exc}")
            decision = decide(definition, machine, event, self._rt.limits)
            assert not isinstance(decision, Rejected)  # the machine is at that attempt
            writes.transition(row, decision, "dispatch_error")
            return
        earlier = writes.sent_before(row.id, task.attempt, task.state)
        agent = self._route(conn, row, writes.now, earlier)
        writes.dispatch(task, agent)

    def send_and_write(self, conn: Connection, writes: Writes) -> None:
        """Send the transaction's state_tasks, then write its changes; the caller commits.

        The rows are locked and the decision is made, so the tasks go out at once: the write
        and the commit (a few milliseconds under load) are not part of an agent's wait. A
        failure or a crash before the commit rolls the decision back and the message that caused
        it is delivered again. What the database is known to refuse (a number past its column,
        a NUL character) is refused before this, one message or machine alone (Writes.transition,
        fsm_celery.core.intake); and a caller that tries the same messages again with the same
        Sent (the batch applier, the scan) records those dispatches without sending them twice.
        Only a crash between the send and the commit sends a state_task twice (at least once);
        its duplicate ack is then refused as stale, and the work is applied once.
        """
        self._rt.dispatcher.dispatch_many(writes.to_send)
        if writes.sent is not None:
            writes.sent.add(writes.sending)  # until the commit (Runtime.transaction)
        writes.write(conn)
        if writes.ended:
            outbox_txn(conn, self._rt, writes)

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
        )

    def _route(
        self, conn: Connection, row: q.AnyRow, now: datetime, earlier: str | None = None
    ) -> str:
        """Where the task goes: the machine's agent, else a live agent of its type, else the
        type's own channel and stream, where any agent of the type may take it. A task a failed
        transaction sent already stays where it went (`earlier`)."""
        if earlier is not None:
            if earlier not in (str(row.agent_id), row.agent_type):
                q.assign_agent_txn(conn, row.id, UUID(earlier))  # as that transaction did
            return earlier
        since = now - timedelta(seconds=self._rt.settings.agent_liveness_seconds)
        if row.agent_id is not None and (
            row.agent_pinned or q.agent_alive_txn(conn, row.agent_id, since)
        ):
            return str(row.agent_id)
        chosen = q.pick_agent_txn(conn, row.agent_type, since, now)
        if chosen is None:
            return str(row.agent_type)
        q.assign_agent_txn(conn, row.id, chosen)
        return str(chosen)


def _awaits_dispatch(row: q.AnyRow, attempt: int) -> bool:
    return (
        row.status == MachineStatus.RUNNING
        and row.attempt == attempt
        and row.dispatch_due_at is not None
    )


def _ms(value: timedelta | None) -> int | None:
    return None if value is None else int(value.total_seconds() * 1000)
