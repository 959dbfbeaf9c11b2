"""Helpers for the pure core's tests: machines and definitions built in memory."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from fsm_celery.core.definition import MachineDefinition
from fsm_celery.core.loader import SHIPPED_DEFINITIONS, load_file
from fsm_celery.core.transition import Machine, MachineStatus, Transition, initial_context

DEFINITIONS = SHIPPED_DEFINITIONS


@pytest.fixture(scope="session")
def build_project() -> MachineDefinition:
    return load_file(DEFINITIONS / "cto_build_project.yaml")


def machine_in(
    definition: MachineDefinition,
    state: str,
    *,
    attempt: int = 1,
    retries: int = 0,
    status: MachineStatus = MachineStatus.RUNNING,
    context: dict[str, Any] | None = None,
) -> Machine:
    """A machine of the definition sitting in the state."""
    return Machine(
        id=uuid.UUID(int=7),
        current_state=state,
        status=status,
        attempt=attempt,
        state_retries=retries,
        context=initial_context(definition, context or {}),
    )


def after(machine: Machine, t: Transition) -> Machine:
    """The machine as the transition leaves it."""
    return Machine(
        machine.id,
        t.to_state,
        t.status,
        t.attempt,
        t.state_retries,
        t.context,
        handbacks=t.handbacks,
    )
