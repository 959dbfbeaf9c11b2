"""What the agent door tells of the held task's machine beyond the task itself: the machine's
history and its state's definition (the resources fsm-celery://task/history and /definition).

Both are in the deployment's database, and the door's one credential is the agent's Redis URL:
it reads them through the Python client only when its settings name a database
(FSM_DATABASE_URL); otherwise each resource says what is needed. Only ever the machine of the
task the calling session holds: the resources take no machine id, so a session reads nothing of
a machine it was not given."""

from __future__ import annotations

from typing import Any

from fsm_celery.client import Client
from fsm_celery.config import Settings
from fsm_celery.core.definition import StateDefinition
from fsm_celery.core.kinds import state_kind
from fsm_celery.core.messages import StateTask
from fsm_celery.exceptions import FsmError

HISTORY_MOST = 200  # steps a history resource shows at the most: the latest
NEEDS_DATABASE = (
    "the machine's history and its states' definitions are in the deployment's database: "
    "start the door with FSM_DATABASE_URL set to read them"
)
EDGES = ("on_success", "on_failure", "on_approve", "on_reject", "on_event", "on_timeout")


class MachineReads:
    """The held task's machine as the database has it (nothing without a database)."""

    def __init__(self, client: Client | None) -> None:
        self.client = client

    @classmethod
    def of(cls, settings: Settings) -> MachineReads:
        """A client when the settings were given a database (not its default), else none."""
        if "database_url" not in settings.model_fields_set:
            return cls(None)
        from fsm_celery import wiring

        return cls(wiring.client(settings))

    def history(self, task: StateTask) -> dict[str, Any]:
        """The machine's steps as `fsm-celery history --json` gives them (a fork's inherited
        steps first), the latest HISTORY_MOST of them."""
        if self.client is None:
            return {"message": NEEDS_DATABASE}
        try:
            own = self.client.history(task.machine_id)
            steps = self._inherited(task) + [r.to_dict() for r in own]
        except FsmError as exc:
            return {"message": str(exc)}
        shown = steps[-HISTORY_MOST:]
        return {
            "machine_id": str(task.machine_id),
            "steps": shown,
            "earlier_steps": len(steps) - len(shown),
        }

    def definition(self, task: StateTask) -> dict[str, Any]:
        """The held state's definition, of the definition version the machine runs."""
        if self.client is None:
            return {"message": NEEDS_DATABASE}
        try:
            version = self.client.get_machine(task.machine_id).definition_version
            found = self.client.definition(task.machine_type, version)
            state = found.definition.state(task.state)
        except (FsmError, KeyError) as exc:
            return {"message": f"the state's definition could not be read: {exc}"}
        return {"machine_type": task.machine_type, "version": found.version, **state_view(state)}

    def _inherited(self, task: StateTask) -> list[dict[str, Any]]:
        """A fork's earlier steps: its source's, up to the one it was forked from."""
        assert self.client is not None
        info = self.client.get_machine(task.machine_id)
        if info.forked_from is None or info.forked_at is None:
            return []
        try:
            records = self.client.history(info.forked_from)
        except FsmError:  # the source was deleted: the fork's own steps are all there is
            return []
        source = {"inherited_from": str(info.forked_from)}
        return [r.to_dict() | source for r in records if r.attempt <= info.forked_at]


def state_view(state: StateDefinition) -> dict[str, Any]:
    """A state's definition as the door shows it: its kind, prompt template, contract, timing
    and transitions (the edges it may leave by, their guards)."""
    dumped = state.model_dump(mode="json", by_alias=True)
    return {
        "state": state.name,
        "kind": state_kind(state),
        "description": state.description,
        "prompt": state.prompt,
        "required_output": list(state.required_output),
        "output_schema": state.output_schema,
        "max_corrections": state.max_corrections,
        "timeout_seconds": state.timeout.total_seconds(),
        "max_retries": state.max_retries,
        "transitions": {edge: dumped[edge] for edge in EDGES if dumped.get(edge)},
    }
