"""What every part of the client shares: the parts it is given, how it hands on the states a
command decided, how it names a machine, and the checks every command makes."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import asdict
from typing import Any
from uuid import UUID

from fsm_celery.core.admin import Command
from fsm_celery.core.timeline import ACTOR_CHARS
from fsm_celery.engine import Handoff, MachineEngine, Next
from fsm_celery.exceptions import InvalidActor, InvalidAgentId
from fsm_celery.records import MachineInfo, jsonable
from fsm_celery.store.queries import AnyRow
from fsm_celery.store.reader import Reader

log = logging.getLogger("fsm_celery.client")


class ClientBase:
    """The engine, the handoff of entering states (Celery, normally), and the store's reads."""

    def __init__(
        self,
        engine: MachineEngine,
        enqueue: Handoff,
        parked: Callable[[int], list[dict[str, str]]] | None = None,
        revoke_user: Callable[[UUID], bool] | None = None,
    ) -> None:
        self.engine = engine
        self.enqueue = enqueue
        self.reader = Reader(engine.db)
        self._parked = parked
        self._revoke_user = revoke_user  # deletes an agent's Redis user (channel.acl)

    def full_id(self, machine_id: UUID | str) -> UUID:
        """The id of the machine, given its id or the start of it (at least four hex digits,
        as git takes a commit's: the dashboard shows eight); MachineNotFound when no machine's
        id starts so, AmbiguousMachineId when more than one does."""
        return self.reader.machine_id(machine_id)

    def get_machine(self, machine_id: UUID | str) -> MachineInfo:
        """The machine with that id or id prefix (MachineNotFound if none)."""
        return MachineInfo.from_row(*self.reader.machine(machine_id))

    def _command(self, machine_id: UUID | str, command: Command) -> MachineInfo:
        check_actor(command.actor)
        mid = self.full_id(machine_id)
        self.enqueue(self.engine.admin.command(mid, command))
        return self.get_machine(mid)

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


def dicts(rows: Iterable[AnyRow]) -> list[dict[str, Any]]:
    """Rows as JSON-ready dicts."""
    return [jsonable(dict(r._mapping)) for r in rows]


def outcome(done: Any) -> dict[str, Any]:
    """What an engine's answer says, JSON-ready, without the states it hands on (`next`)."""
    return jsonable({k: v for k, v in asdict(done).items() if k != "next"})


def agent_uuid(value: UUID | str) -> UUID:
    """An agent's id (InvalidAgentId when the value is not one)."""
    try:
        return value if isinstance(value, UUID) else UUID(value)
    except ValueError:
        raise InvalidAgentId(value) from None


def check_actor(actor: str) -> None:
    """Who acted must fit the history's column (the database would refuse it mid-command)."""
    if len(actor) > ACTOR_CHARS:
        raise InvalidActor(actor, ACTOR_CHARS)
