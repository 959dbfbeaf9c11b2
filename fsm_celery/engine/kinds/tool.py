"""The tool state kind, worked by a worker, not an agent: entering it sets its deadline and,
once the transaction commits, has its call made (the Runtime's Caller: an fsm.call_tool task);
engine/tools.py applies what the call came to. A state whose arguments cannot be rendered fails
its attempt, nothing called (as an agent state whose prompt cannot be)."""

from __future__ import annotations

from fsm_celery.core import tool
from fsm_celery.core.attempt_events import DispatchFailed
from fsm_celery.core.prompt import PromptError
from fsm_celery.core.steps import Step
from fsm_celery.core.transition import Rejected, decide
from fsm_celery.engine.kinds.base import Entering
from fsm_celery.engine.runtime import Runtime


class ToolState:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    def enter_txn(self, at: Entering) -> None:
        """Check that the call's arguments render, set the attempt's deadline, and record the
        call to be made once the transaction commits."""
        _, _, row, definition, state, writes, machine = at
        assert state.tool is not None
        try:
            tool.arguments(state.tool, machine.context, self._rt.settings.max_payload_bytes)
        except PromptError as exc:
            event = DispatchFailed(state.name, machine.attempt, f"tool call of {state.name}: {exc}")
            decision = decide(definition, machine, event, self._rt.limits)
            assert not isinstance(decision, Rejected)  # the machine is at that attempt
            writes.transition(row, decision, "dispatch_error")
            return
        writes.entering(row.id, writes.now + state.timeout, row.agent_id)
        writes.out.calls.append(
            Step(row.id, machine.attempt, 0.0, state.name, row.type, root_id=row.root_id)
        )
