"""State kinds as plug-ins: what entering a state does, by the kind its definition gives it.

Each kind is a module here implementing StateKind (kinds/base.py), registered in `kinds`
under the name `state_kind` gives its states:

- `agent`: an agent works it: its state_task sent (kinds/agent.py);
- `fan_out`: children do its work, joined once (kinds/fanout.py; kinds/joins.py counts their
  ends, kinds/plan.py plans them);
- `approval`: people decide it at a gate (kinds/approval.py);
- `wait`: an outside event decides it (kinds/wait.py);
- `tool`: a worker calls one tool of an MCP server (kinds/tool.py).

What decides a state of each kind comes through its own door: an agent's ack (engine/inbox),
the join of its children (kinds/joins.py), people's verdict (engine/approvals), an event
(engine/signals), the tool's result (engine/tools); each records a transition on the
transaction's Writes. What leaving one means runs as hooks of the transaction, over the
transitions it recorded: a fan-out's children follow their parent (kinds/joins.py), an
agent's slot is freed (engine/slots.py), a gate is closed as left and a notification queued
(at the write: engine/entry.py's send_and_write).

A new kind is a new module and one line in `kinds`, and its name in `state_kind`
(fsm_celery.core.kinds: pure, so that naming the kind enters no module of the engine on the
path of an ack).
"""

from __future__ import annotations

from fsm_celery.core.kinds import state_kind
from fsm_celery.engine.kinds.agent import AgentState
from fsm_celery.engine.kinds.approval import ApprovalGate
from fsm_celery.engine.kinds.base import Entering, StateKind
from fsm_celery.engine.kinds.fanout import FanOut
from fsm_celery.engine.kinds.tool import ToolState
from fsm_celery.engine.kinds.wait import Wait
from fsm_celery.engine.runtime import Runtime
from fsm_celery.engine.slots import Slots

__all__ = ["Entering", "StateKind", "kinds", "state_kind"]


def kinds(runtime: Runtime, slots: Slots, fanout: FanOut) -> dict[str, StateKind]:
    """The table of state kinds, one row each."""
    return {
        "agent": AgentState(runtime, slots),
        "fan_out": fanout,
        "approval": ApprovalGate(runtime),
        "wait": Wait(runtime),
        "tool": ToolState(runtime),
    }
