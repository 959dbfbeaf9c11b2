"""The fsm-celery error tree (how a process ends on one of them is fsm_celery.exits's).

FsmError                      root of everything this package raises
├── InsecureSecret            a signing secret is the default, empty, short or a pattern
├── InsecureDashboard         the HTTP API would serve without tokens, or with guessable ones
├── InsecureFlower            Flower would serve without authentication
├── DatabaseNotCreated        db upgrade --create could not create the database
├── DefinitionError           a machine definition is invalid (carries every problem)
├── CannotListen              the dashboard's address is taken or not this machine's
├── DevStackError             `fsm-celery dev` could not start its PostgreSQL or Redis
├── ScheduleNotFound          no schedule has that name
├── AgentNotFound             the deployment never knew an agent of that id
├── InvalidActor              who acted does not fit the history's column
└── MachineError              an operation on a machine instance was refused
    ├── UnknownMachineType    no definition is loaded for that type
    ├── VersionNotFound       the machine type has no such version
    ├── WrongDefinition       a definition given for a machine is of another type
    ├── MachineNotFound       no machine has that id
    ├── AmbiguousMachineId    more than one machine's id starts with the prefix given
    ├── StepNotFound          the machine's history has no such step
    ├── InvalidContext        the context given at start is not a JSON object
    │   └── ContextMismatch   … or does not match its definition's context_schema
    ├── InvalidAgentId        the agent id given at start is not a UUID
    ├── InvalidStartKey       a start's key is empty, over 200 characters, or not printable
    ├── StartKeyReused        a start's key holds a machine of another type or context
    ├── CommandRefused        an admin command does not apply to the machine as it is
    │   ├── GateClosed        a decision came for a gate that is not open (or not this one)
    │   └── EventRefused      an event for a machine that waits for nothing more, or too many
    ├── NotAnApprover         the person deciding is in none of the gate's groups
    ├── InvalidDecision       a decision's fields do not fill in its gate's form
    ├── InvalidEvent          an event no state of the machine waits for, or a payload unfit
    ├── Unstorable            what a transition would write does not fit its columns
    └── InvalidChildInput     a fan-out child's input expression fails or gives no object
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


class FsmError(Exception):
    """Root of all fsm-celery errors."""


GENERATE = "$(python3 -c 'import secrets; print(secrets.token_hex(32))')"


def _setting(problem: str, default: str) -> str:
    """The FSM_* setting a problem starts by naming (each problem does), else the default."""
    first = problem.partition(" ")[0]
    return first if first.startswith("FSM_") else default


class InsecureSecret(FsmError):
    """A long-running process was asked to start with a guessable secret (task tokens,
    notifications)."""

    def __init__(self, problem: str) -> None:
        self.problem = problem
        setting = _setting(problem, "FSM_TASK_TOKEN_SECRET")
        super().__init__(
            f"{problem}: anyone who guesses it could forge what it signs. Set it to at least "
            f"32 random bytes, e.g. export {setting}={GENERATE}"
        )


class InsecureDashboard(FsmError):
    """The HTTP API and dashboard were asked to serve without a token anyone needs to know,
    or with a guessable token or secret."""

    def __init__(self, problem: str) -> None:
        self.problem = problem
        if problem.startswith("FSM_"):  # a guessable one: that setting, named
            fix = f"set {_setting(problem, '')} to 32+ random bytes, e.g. {GENERATE}"
        else:
            fix = (
                "set FSM_ADMIN_TOKEN (and FSM_VIEWER_TOKEN) to 32+ random bytes each, e.g. "
                f"{GENERATE}, or FSM_PUBLIC_READS=true to serve reads to anyone"
            )
        super().__init__(f"{problem}: {fix}")


class DatabaseNotCreated(FsmError):
    """`fsm-celery db upgrade --create` could not create the database (no permission, say)."""


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
    line: int | None = None  # 1-based, where the YAML itself is wrong
    column: int | None = None

    def __str__(self) -> str:
        where = self.source
        if self.line is not None:
            where += f":{self.line}:{self.column or 1}"
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


class CannotListen(FsmError):
    """The dashboard cannot listen where it was asked to (found before the server starts)."""

    def __init__(self, host: str, port: int, reason: str) -> None:
        self.host = host
        self.port = port
        super().__init__(reason)

    @classmethod
    def in_use(cls, host: str, port: int) -> CannotListen:
        return cls(host, port, f"port {port} on {host} is in use — pick another with --port")


class DevStackError(FsmError):
    """`fsm-celery dev` could not start a server: what (a binary, a server) and why."""

    def __init__(self, what: str, why: str) -> None:
        self.what, self.why = what, why
        super().__init__(f"{what}: {why}")


class MachineError(FsmError):
    """An operation on a machine was refused."""


class UnknownMachineType(MachineError):
    """No definition is loaded for the requested machine type."""

    def __init__(self, machine_type: str, known: Sequence[str] = ()) -> None:
        self.machine_type = machine_type
        self.known = list(known)
        types = f"known types: {', '.join(known)}" if known else "no definition is loaded"
        super().__init__(
            f"unknown machine type {machine_type!r} ({types}): load its definition first "
            "(fsm-celery definitions load)"
        )


class VersionNotFound(MachineError):
    """The machine type has no such stored version."""

    def __init__(self, machine_type: str, version: int, versions: Sequence[int]) -> None:
        self.machine_type = machine_type
        known = ", ".join(map(str, versions)) or "none"
        super().__init__(f"{machine_type} has no version {version} (its versions: {known})")


class WrongDefinition(MachineError):
    """A definition given to replay a machine is of another type than the machine's."""

    def __init__(self, machine_id: str, machine_type: str, given: str) -> None:
        self.machine_id = machine_id
        super().__init__(
            f"machine {machine_id} is a {machine_type}; the definition given is a {given}"
        )


class MachineNotFound(MachineError):
    """No machine has the requested id (or starts with the requested prefix)."""

    def __init__(self, machine_id: str, hint: str = "") -> None:
        self.machine_id = machine_id
        super().__init__(f"no machine with id {machine_id!r}{hint}")


ARCHIVED = "its month was archived and removed by the retention (FSM_HISTORY_RETENTION_DAYS)"


class StepNotFound(MachineError):
    """The machine's history has no such step (attempt)."""

    def __init__(self, machine_id: str, step: int | None, last: int | None) -> None:
        self.machine_id = machine_id
        last_text = f"its last is {last}" if last is not None else f"it has no history: {ARCHIVED}"
        super().__init__(f"machine {machine_id} has no step {step}: {last_text}")


class AmbiguousMachineId(MachineError):
    """More than one machine's id starts with the prefix given (as git says of a short hash)."""

    def __init__(self, prefix: str, candidates: Sequence[str], more: bool) -> None:
        self.prefix = prefix
        self.candidates = list(candidates)
        listed = ", ".join(candidates) + (", ..." if more else "")
        super().__init__(f"machine id {prefix!r} is ambiguous: give more of it ({listed})")


class InvalidContext(MachineError):
    """The context given to start a machine is not a JSON object."""


class ContextMismatch(InvalidContext):
    """The context given to start a machine does not match its definition's context_schema."""

    def __init__(self, machine_type: str, detail: str) -> None:
        self.machine_type = machine_type
        self.detail = detail
        super().__init__(f"context for {machine_type}: {detail}")


class InvalidAgentId(MachineError):
    """The agent id given to start a machine is not a UUID."""

    def __init__(self, agent_id: object) -> None:
        self.agent_id = agent_id
        super().__init__(f"agent id must be a UUID, got {agent_id!r}")


class InvalidStartKey(MachineError):
    """The key given to start a machine is not one a start can hold."""

    def __init__(self, key: object, detail: str) -> None:
        self.key = key
        self.detail = detail
        shown = key if not isinstance(key, str) or len(key) <= 60 else key[:60] + "…"
        super().__init__(f"start key {shown!r}: {detail}")


class StartKeyReused(MachineError):
    """A start repeated with a key asks for another machine than the one the key started:
    another type, context, agent or GitHub issue (`differs` names which)."""

    def __init__(
        self, key: str, machine_id: str, machine_type: str, differs: Sequence[str]
    ) -> None:
        self.key = key
        self.machine_id = machine_id
        self.machine_type = machine_type
        self.differs = tuple(differs)
        super().__init__(
            f"start key {key!r} holds machine {machine_id} (a {machine_type}), started with "
            f"another {' and another '.join(self.differs)}: a start repeated with its key must "
            "ask the same; give another key for another start"
        )


class CommandRefused(MachineError):
    """An admin command does not apply to the machine in its current status."""

    def __init__(self, action: str, machine_id: str, detail: str) -> None:
        self.action = action
        self.machine_id = machine_id
        self.detail = detail
        super().__init__(f"{action} refused for machine {machine_id}: {detail}")


class GateClosed(CommandRefused):
    """A decision came for an approval gate that is not open: the machine is elsewhere,
    paused, past that gate, or its gate was decided already."""

    def __init__(self, machine_id: str, detail: str) -> None:
        super().__init__("decision", machine_id, detail)


class EventRefused(CommandRefused):
    """An outside event for a machine that has ended, or of which enough are kept already."""

    def __init__(self, machine_id: str, detail: str) -> None:
        super().__init__("event", machine_id, detail)


class InvalidEvent(MachineError):
    """An outside event no state of the machine waits for, or whose payload does not match the
    waiting state's schema, or is too large."""

    def __init__(self, machine_id: str, detail: str) -> None:
        self.machine_id = machine_id
        self.detail = detail
        super().__init__(f"event for machine {machine_id}: {detail}")


class NotAnApprover(MachineError):
    """The person deciding at an approval gate is in none of its approver groups."""

    def __init__(self, actor: str, state: str, groups: Sequence[str]) -> None:
        self.actor = actor
        super().__init__(
            f"{actor} may not decide at {state}: its approvers are {', '.join(groups)} "
            "(FSM_APPROVERS), or an admin"
        )


class InvalidDecision(MachineError):
    """A decision's fields do not fill in its gate's form, or are too large."""

    def __init__(self, machine_id: str, detail: str) -> None:
        self.machine_id = machine_id
        self.detail = detail
        super().__init__(f"decision for machine {machine_id}: {detail}")


class Unstorable(MachineError):
    """What a transition would write cannot be stored (a number past its column, a NUL):
    found before anything is sent or written, so that the transition is refused alone."""

    def __init__(self, machine_id: str, detail: str) -> None:
        self.machine_id = machine_id
        self.detail = detail
        super().__init__(f"machine {machine_id}: {detail}")


class AgentNotFound(FsmError):
    """The deployment never issued credentials to, nor heard from, an agent of that id."""

    def __init__(self, agent_id: str) -> None:
        self.agent_id = agent_id
        super().__init__(
            f"no agent {agent_id}: it was never issued credentials (fsm-celery agents "
            "credentials) and never reported"
        )


class InvalidChildInput(MachineError):
    """A fan-out child's input expression failed, or did not give an object."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(detail)


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
