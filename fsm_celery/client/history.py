"""The client's machine pasts: the history, the context at a step, and travel through them
(rewind, fork, replay)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any
from uuid import UUID

from fsm_celery.client.base import ClientBase, check_actor
from fsm_celery.core import timeline
from fsm_celery.core.definition import MachineDefinition
from fsm_celery.core.loader import load_file
from fsm_celery.engine.replays import MachineReplay
from fsm_celery.exceptions import StepNotFound
from fsm_celery.records import MachineInfo, Rewinding, TransitionRecord


class History(ClientBase):
    """Read a machine's past, and go back to it."""

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
        rows = self.reader.history(machine_id)
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

    def context_at(self, machine_id: UUID | str, step: int | None = None) -> dict[str, Any]:
        """The machine's context as it was after a step (its latest when none is given),
        reconstructed from the changes the history records: the step, its event and states,
        and the context (None for a machine whose early history kept no changes)."""
        mid, rows = self.reader.context_deltas(machine_id, step)
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
        check_actor(actor)
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
        check_actor(actor)
        first = self.engine.fork.fork(self.full_id(machine_id), step, actor, reason, edits)
        self._hand_on([first])
        return first.machine_id

    def forks(self, machine_id: UUID | str) -> list[MachineInfo]:
        """The machines forked from this one, oldest first."""
        return [MachineInfo.from_row(r) for r in self.reader.forks(machine_id)]

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


def _definition_of(definition: MachineDefinition | str | Path) -> tuple[MachineDefinition, str]:
    """A definition given, or read from its file (DefinitionError naming what is wrong), and
    how a replay names it."""
    if isinstance(definition, MachineDefinition):
        return definition, f"{definition.type} (given)"
    return load_file(definition), str(definition)
