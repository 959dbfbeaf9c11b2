"""Replay, read side: machines' recorded histories run again through the core
(fsm_celery.core.replay) against a definition — a stored version of their type (the newest by
default) or one not loaded yet — to see what it would do to real runs. Only reads; nothing is
sent, written or locked."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from sqlalchemy import Connection

from fsm_celery.core.definition import MachineDefinition
from fsm_celery.core.replay import Replay, Row, replay
from fsm_celery.engine.usecase import UseCase
from fsm_celery.exceptions import MachineNotFound, VersionNotFound, WrongDefinition
from fsm_celery.store import queries as q
from fsm_celery.store import reads

ENDED = ("completed", "failed", "cancelled")
MOST = 10_000  # machines replayed in one call of `last`


@dataclass(frozen=True)
class MachineReplay:
    """One machine's replay: the machine, the version it ran and what it was replayed against
    (`v3`, or the file given), and the verdict."""

    machine_id: UUID
    machine_type: str
    version: int
    against: str
    status: str
    replay: Replay

    def to_dict(self) -> dict[str, Any]:
        found = self.replay
        return {
            "machine_id": str(self.machine_id),
            "machine_type": self.machine_type,
            "version": self.version,
            "against": self.against,
            "status": self.status,
            "outcome": found.outcome.value,
            "at": found.at,
            "why": found.why,
            "replayed_status": found.status,
            "steps": [
                {
                    "step": s.attempt,
                    "event": s.event,
                    "state": s.state,
                    "recorded": s.recorded,
                    "replayed": s.replayed,
                    "why": s.why,
                }
                for s in found.steps
            ],
        }


class Replays(UseCase):
    def machine(
        self,
        machine_id: UUID,
        definition: MachineDefinition | None = None,
        version: int | None = None,
        against: str = "the file given",
    ) -> MachineReplay:
        """Replay one machine against `definition` (of its type, or of the root type of a
        child's), else its type's stored `version`, else its type's newest."""
        with self._rt.db.connect() as conn:
            row = q.get_machine_txn(conn, machine_id)
            if row is None:
                raise MachineNotFound(str(machine_id))
            if definition is not None:
                found = _for(definition, row)
            else:
                version, found = self._stored(conn, row.type, version)
                against = f"v{version}"
            history = replay_rows(q.history_txn(conn, machine_id))
        return self._replayed(row, found, against, history)

    def last(
        self, definition: MachineDefinition, count: int, against: str = "the file given"
    ) -> list[MachineReplay]:
        """Replay the last `count` machines of the definition's type that ended (newest
        first) against it."""
        with self._rt.db.connect() as conn:
            rows = q.ended_machines_txn(conn, definition.type, ENDED, min(count, MOST))
            histories = q.histories_txn(conn, {r.id: r.created_at for r in rows})
        return [
            self._replayed(row, definition, against, replay_rows(histories.get(row.id, ())))
            for row in rows
        ]

    def _stored(
        self, conn: Connection, machine_type: str, version: int | None
    ) -> tuple[int, MachineDefinition]:
        root = machine_type.split(".", 1)[0]
        versions = reads.versions_of_txn(conn, root)
        if version is None and versions:
            version = versions[0]
        if version is None or version not in versions:
            raise VersionNotFound(root, version or 0, sorted(versions))
        return version, self._rt.catalog.version(conn, machine_type, version)

    def _replayed(
        self, row: q.AnyRow, definition: MachineDefinition, against: str, history: list[Row]
    ) -> MachineReplay:
        found = replay(
            definition, history, status=row.status, limits=self._rt.limits, machine_id=row.id
        )
        return MachineReplay(row.id, row.type, row.definition_version, against, row.status, found)


def _for(definition: MachineDefinition, row: q.AnyRow) -> MachineDefinition:
    """The definition for the machine: itself, or the part a child's inline type names."""
    root = row.type.split(".", 1)[0]
    if definition.type != root:
        raise WrongDefinition(str(row.id), row.type, definition.type)
    try:
        return definition.at(row.type)
    except (KeyError, IndexError, AssertionError):  # a place the definition has not
        raise WrongDefinition(str(row.id), row.type, f"{definition.type} without it") from None


def replay_rows(rows: Sequence[q.AnyRow]) -> list[Row]:
    """What replay reads of history rows."""
    return [
        Row(
            attempt=r.attempt,
            event=r.event,
            from_state=r.from_state,
            to_state=r.to_state,
            success=r.success,
            output=r.output,
            error=r.error_message,
            actor=r.actor,
            reason=r.reason,
            failure=r.failure,
            context_delta=r.context_delta,
        )
        for r in rows
    ]
