"""Admin commands decided as values: what each does, and when each is refused."""

from __future__ import annotations

import pytest

from fsm_celery.core.admin import BUDGET, Action, Command, commands, decide_command
from fsm_celery.core.definition import MachineDefinition
from fsm_celery.core.transition import MachineStatus, Rejected, RejectReason, Transition
from tests.unit.conftest import machine_in

S = MachineStatus


def run(d: MachineDefinition, status: S, action: Action, **kw: str) -> Transition | Rejected:
    state = "FAILED" if status is S.FAILED else "WRITE_CODE"
    m = machine_in(d, state, attempt=7, retries=1, status=status)
    target = kw.pop("target", None)
    return decide_command(d, m, Command(action, "ops", "why", target), kw.get("last"))


@pytest.mark.parametrize(
    ("status", "action", "to_state", "new_status"),
    [
        (S.RUNNING, Action.PAUSE, "WRITE_CODE", S.PAUSED),
        (S.PAUSED, Action.RESUME, "WRITE_CODE", S.RUNNING),
        (S.RUNNING, Action.CANCEL, "WRITE_CODE", S.CANCELLED),
        (S.PAUSED, Action.CANCEL, "WRITE_CODE", S.CANCELLED),
        (S.RUNNING, Action.RETRY, "WRITE_CODE", S.RUNNING),
        (S.CANCELLED, Action.RETRY, "WRITE_CODE", S.RUNNING),
    ],
)
def test_command_moves_the_machine(
    build_project: MachineDefinition, status: S, action: Action, to_state: str, new_status: S
) -> None:
    t = run(build_project, status, action)
    assert isinstance(t, Transition)
    assert (t.to_state, t.status, t.attempt, t.success) == (to_state, new_status, 8, True)


def test_retry_resets_the_state_retry_count(build_project: MachineDefinition) -> None:
    t = run(build_project, S.RUNNING, Action.RETRY)
    assert isinstance(t, Transition) and t.state_retries == 0


def test_retry_of_a_failed_machine_goes_back_to_where_it_failed(
    build_project: MachineDefinition,
) -> None:
    t = run(build_project, S.FAILED, Action.RETRY, last="DEPLOY_PROD")
    assert isinstance(t, Transition)
    assert (t.from_state, t.to_state, t.status) == ("FAILED", "DEPLOY_PROD", S.RUNNING)


@pytest.mark.parametrize(
    ("target", "status"),
    [("DEPLOY_PROD", S.RUNNING), ("COMPLETE", S.COMPLETED), ("FAILED", S.FAILED)],
)
def test_force_goes_to_the_target_with_its_status(
    build_project: MachineDefinition, target: str, status: S
) -> None:
    t = run(build_project, S.PAUSED, Action.FORCE, target=target)
    assert isinstance(t, Transition) and (t.to_state, t.status) == (target, status)


@pytest.mark.parametrize(
    ("status", "action"),
    [
        (S.PAUSED, Action.PAUSE),
        (S.RUNNING, Action.RESUME),
        (S.COMPLETED, Action.CANCEL),
        (S.COMPLETED, Action.RETRY),
        (S.CANCELLED, Action.RESUME),
    ],
)
def test_commands_that_do_not_apply_are_refused(
    build_project: MachineDefinition, status: S, action: Action
) -> None:
    r = run(build_project, status, action)
    assert isinstance(r, Rejected) and r.reason is RejectReason.REFUSED_COMMAND
    assert f"cannot {action.value} a {status.value} machine" == r.detail


def test_force_to_an_unknown_state_names_the_states(build_project: MachineDefinition) -> None:
    r = run(build_project, S.RUNNING, Action.FORCE, target="LAUNCH")
    assert isinstance(r, Rejected)
    assert "one of ANALYZE_ISSUE, WRITE_SPEC" in r.detail and "'LAUNCH'" in r.detail


@pytest.mark.parametrize("status", list(S))
def test_the_commands_offered_in_a_status_are_exactly_those_it_does_not_refuse(
    build_project: MachineDefinition, status: S
) -> None:
    def accepted(action: Action) -> bool:
        target = "DEPLOY_PROD" if action is Action.FORCE else None
        return isinstance(
            run(build_project, status, action, target=target, last="WRITE_CODE"), Transition
        )

    assert commands(status) == [a.value for a in Action if accepted(a)] + [BUDGET]


@pytest.mark.parametrize(
    ("status", "offered"),
    [
        (S.RUNNING, ["pause", "cancel", "retry", "force", "budget"]),
        (S.PAUSED, ["resume", "cancel", "retry", "force", "budget"]),
        (S.COMPLETED, ["force", "budget"]),
        (S.FAILED, ["retry", "force", "budget"]),
        (S.CANCELLED, ["retry", "force", "budget"]),
    ],
)
def test_a_finished_machine_is_offered_no_pause_resume_or_cancel(
    status: S, offered: list[str]
) -> None:
    assert commands(status) == offered
