"""The fsm-celery error tree.

FsmError                      root of everything this package raises
├── InsecureSecret            the task token secret is the default, empty or too short
├── InsecureDashboard         the HTTP API would serve without tokens, or with short ones
├── DefinitionError           a machine definition is invalid (carries every problem)
└── MachineError              an operation on a machine instance was refused
    ├── UnknownMachineType    no definition is loaded for that type
    ├── MachineNotFound       no machine has that id
    ├── InvalidContext        the context given at start is not a JSON object
    ├── InvalidAgentId        the agent id given at start is not a UUID
    ├── CommandRefused        an admin command does not apply to the machine as it is
    └── Unstorable            what a transition would write does not fit its columns
"""

from __future__ import annotations

from dataclasses import dataclass


class FsmError(Exception):
    """Root of all fsm-celery errors."""


class InsecureSecret(FsmError):
    """A long-running process was asked to start with a guessable task token secret."""

    def __init__(self, problem: str) -> None:
        self.problem = problem
        super().__init__(
            f"{problem}: anyone could forge acks. Set it to at least 32 random bytes, e.g. "
            "export FSM_TASK_TOKEN_SECRET="
            "$(python3 -c 'import secrets; print(secrets.token_hex(32))')"
        )


class InsecureDashboard(FsmError):
    """The HTTP API and dashboard were asked to serve without a token anyone needs to know."""

    def __init__(self, problem: str) -> None:
        self.problem = problem
        super().__init__(
            f"{problem}: set FSM_ADMIN_TOKEN (and FSM_VIEWER_TOKEN) to 32+ random bytes each, "
            "e.g. $(python3 -c 'import secrets; print(secrets.token_urlsafe(32))'), or "
            "FSM_PUBLIC_READS=true to serve reads to anyone"
        )


class InsecureFlower(FsmError):
    """Flower was asked to serve without authentication, or beyond this machine without it.

    Flower shows every task's arguments (machine ids and states) and can revoke tasks and
    shut workers down: nobody reaches it without a password."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a definition, located by file, state and field."""

    message: str
    source: str = "<definition>"
    state: str | None = None
    field: str | None = None

    def __str__(self) -> str:
        where = self.source
        if self.state is not None:
            where += f": state {self.state}"
        if self.field is not None:
            where += f": field {self.field}"
        return f"{where}: {self.message}"


class DefinitionError(FsmError):
    """A machine definition failed to load or validate."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


class MachineError(FsmError):
    """An operation on a machine was refused."""


class UnknownMachineType(MachineError):
    """No definition is loaded for the requested machine type."""

    def __init__(self, machine_type: str) -> None:
        self.machine_type = machine_type
        super().__init__(
            f"unknown machine type {machine_type!r}: load its definition first "
            "(fsm-celery definitions load)"
        )


class MachineNotFound(MachineError):
    """No machine has the requested id."""

    def __init__(self, machine_id: str) -> None:
        self.machine_id = machine_id
        super().__init__(f"no machine with id {machine_id!r}")


class InvalidContext(MachineError):
    """The context given to start a machine is not a JSON object."""


class InvalidAgentId(MachineError):
    """The agent id given to start a machine is not a UUID."""

    def __init__(self, agent_id: object) -> None:
        self.agent_id = agent_id
        super().__init__(f"agent id must be a UUID, got {agent_id!r}")


class CommandRefused(MachineError):
    """An admin command does not apply to the machine in its current status."""

    def __init__(self, action: str, machine_id: str, detail: str) -> None:
        self.action = action
        self.machine_id = machine_id
        self.detail = detail
        super().__init__(f"{action} refused for machine {machine_id}: {detail}")


class Unstorable(MachineError):
    """What a transition would write cannot be stored (a number past its column, a NUL):
    found before anything is sent or written, so that the transition is refused alone."""

    def __init__(self, machine_id: str, detail: str) -> None:
        self.machine_id = machine_id
        self.detail = detail
        super().__init__(f"machine {machine_id}: {detail}")


class ScheduleNotFound(FsmError):
    """No schedule has the requested name."""

    def __init__(self, ref: str, choices: list[str]) -> None:
        self.ref = ref
        known = ", ".join(choices) if choices else "none is loaded"
        super().__init__(f"no schedule {ref!r} (TYPE/NAME; schedules: {known})")


class InvalidActor(FsmError):
    """Who did it: a name that fits the audit's column."""

    def __init__(self, actor: str, most: int) -> None:
        super().__init__(f"--actor is {len(actor)} characters long: at most {most}")
