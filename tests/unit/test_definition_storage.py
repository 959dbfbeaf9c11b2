"""A stored definition reloads to exactly the definition that was loaded.

The store keeps `to_json()` and reads it back with `parse_definition` (store/queries.py): any
field the dump leaves out comes back as its default, which must be the value it had. Checked
over the shipped definitions and over generated ones (every kind of state, durations in every
form, waiting states whose timeout equals another kind's default).
"""

from __future__ import annotations

import itertools
import json
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsm_celery.core.definition import MachineDefinition
from fsm_celery.core.loader import definition_files, load_all, load_text, parse_definition
from tests.unit.conftest import DEFINITIONS

SHIPPED = load_all(definition_files(DEFINITIONS))
PROPERTY = settings(
    max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)


def stored_and_reloaded(definition: MachineDefinition) -> MachineDefinition:
    """What the store gives back: its JSON column, read as a stored version is."""
    return parse_definition(json.loads(json.dumps(definition.to_json())), check=False)


def same(again: MachineDefinition, definition: MachineDefinition) -> bool:
    """Every field equal, defaults included (not the caches the validator fills)."""
    return again.model_dump() == definition.model_dump()


@pytest.mark.parametrize("definition", SHIPPED, ids=[d.type for d in SHIPPED])
def test_a_shipped_definition_reloads_to_itself(definition: MachineDefinition) -> None:
    again = stored_and_reloaded(definition)
    assert same(again, definition)
    assert again.digest() == definition.digest()


@pytest.mark.parametrize("kind", ["approval: {approvers: [release]}", "wait: {event: pr_merged}"])
@pytest.mark.parametrize("timeout", ["300", "5m", "PT5M"])
def test_a_waiting_state_of_five_minutes_is_stored_as_five_minutes(kind: str, timeout: str) -> None:
    ways = (
        "on_approve: DONE\n    on_reject: DONE"
        if kind.startswith("approval")
        else "on_event: DONE\n    on_timeout: DONE"
    )
    definition = load_text(
        "type: t\nagent_type: a\ninitial_state: ASK\nstates:\n"
        f"  - name: ASK\n    {kind}\n    timeout: {timeout}\n    {ways}\n"
        "  - name: DONE\n    terminal: completed\n"
    )
    assert definition.state("ASK").timeout == timedelta(minutes=5)
    assert stored_and_reloaded(definition).state("ASK").timeout == timedelta(minutes=5)


# -- generated definitions ---------------------------------------------------------------------

DURATIONS = st.sampled_from(
    [300, "300", "5m", "300s", "PT5M", 86_400, "1d", "24h", "P1D", "1h30m", "2d 4h", 1.5, "90s"]
) | st.integers(min_value=1, max_value=2_592_000)


@st.composite
def agent_state(draw: st.DrawFn, name: str, following: str) -> dict[str, Any]:
    state: dict[str, Any] = {"name": name, "on_success": following, "on_failure": "FAILED"}
    if draw(st.booleans()):
        state["timeout"] = draw(DURATIONS)
    if draw(st.booleans()):
        state["max_retries"] = draw(st.integers(min_value=0, max_value=5))
        state["retry_on"] = draw(
            st.lists(st.sampled_from(["failure", "timeout", "invalid_output"]), unique=True)
        )
        state["backoff"] = {"delay": draw(st.sampled_from([0, 1, "1s", "10s"])), "rate": 1.5}
    if draw(st.booleans()):
        state["heartbeat_timeout"] = draw(st.sampled_from([30, "30s", "PT1M", "1m"]))
    return state


@st.composite
def waiting_state(draw: st.DrawFn, name: str, following: str) -> dict[str, Any]:
    if draw(st.booleans()):
        state: dict[str, Any] = {
            "name": name,
            "approval": {"approvers": ["release"], "quorum": draw(st.sampled_from([1, 2]))},
            "on_approve": following,
            "on_reject": "FAILED",
            "on_timeout": draw(st.sampled_from(["approve", "reject", "FAILED"])),
        }
    else:
        state = {
            "name": name,
            "wait": {"event": "pr_merged"},
            "on_event": following,
            "on_timeout": "FAILED",
        }
    if draw(st.booleans()):
        state["timeout"] = draw(DURATIONS)
    return state


@st.composite
def map_state(draw: st.DrawFn, name: str, following: str) -> dict[str, Any]:
    inner = draw(st.one_of(agent_state("WORK", "DONE"), waiting_state("WORK", "DONE")))
    if "on_failure" not in inner and "on_reject" not in inner:
        inner["on_timeout"] = "FAILED"
    return {
        "name": name,
        "map": {
            "items": "context.items",
            "max_concurrency": 2,
            "initial_state": "WORK",
            "states": [
                inner,
                {"name": "DONE", "terminal": "completed"},
                {"name": "FAILED", "terminal": "failed"},
            ],
        },
        "on_success": following,
        "on_failure": "FAILED",
        **({"timeout": draw(DURATIONS)} if draw(st.booleans()) else {}),
    }


@st.composite
def definitions(draw: st.DrawFn) -> MachineDefinition:
    count = draw(st.integers(min_value=1, max_value=4))
    names = [f"S{i}" for i in range(count)] + ["DONE"]
    states = [
        draw(st.one_of(agent_state(n, after), waiting_state(n, after), map_state(n, after)))
        for n, after in itertools.pairwise(names)
    ]
    states += [{"name": "DONE", "terminal": "completed"}, {"name": "FAILED", "terminal": "failed"}]
    data = {"type": "generated", "agent_type": "cto", "initial_state": "S0", "states": states}
    return parse_definition(data)


@PROPERTY
@given(definitions())
def test_a_generated_definition_reloads_to_itself(definition: MachineDefinition) -> None:
    again = stored_and_reloaded(definition)
    assert same(again, definition)
    assert again.digest() == definition.digest()
