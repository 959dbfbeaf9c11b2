"""Output contracts in the pure core: an answer's problems by JSON pointer, bounded;
required_output as the short form; the schema and the guards checked when a definition loads;
the refusal decided as a value."""

from __future__ import annotations

import textwrap
from typing import Any
from uuid import uuid4

import pytest

from fsm_celery.core.attempt_events import Ack
from fsm_celery.core.contract import (
    MAX_PROBLEMS,
    MESSAGE_CHARS,
    SUMMARY_CHARS,
    Flaw,
    flaws,
    schema_of,
    summary,
)
from fsm_celery.core.correction import refusal
from fsm_celery.core.definition import FailureKind
from fsm_celery.core.loader import load_text
from fsm_celery.core.transition import Limits, Machine, MachineStatus, Transition, decide
from fsm_celery.exceptions import DefinitionError

SCHEMA = {
    "type": "object",
    "properties": {
        "passed": {"type": "boolean"},
        "score": {"type": "integer", "minimum": 0},
        "files": {"type": "array", "items": {"type": "string"}},
        "a/b": {"type": "object", "properties": {"c~d": {"type": "string"}}},
    },
}


def test_an_answer_that_holds_to_its_contract_has_no_problems() -> None:
    assert flaws(SCHEMA, {"passed": True, "score": 3, "files": ["x"]}) == ()


def test_each_problem_is_named_by_its_json_pointer() -> None:
    found = flaws(SCHEMA, {"passed": "yes", "files": ["x", 3], "a/b": {"c~d": 1}})
    assert {f.pointer for f in found} == {"/passed", "/files/1", "/a~1b/c~0d"}
    assert all(f.message for f in found)


def test_a_problem_of_the_whole_output_has_the_empty_pointer() -> None:
    assert flaws(schema_of(None, ["one"]), {}) == (Flaw("", "'one' is a required property"),)


def test_the_problems_are_bounded_in_number_and_length() -> None:
    schema = {"type": "object", "additionalProperties": {"type": "integer"}}
    answer = {f"k{i}": "x" * 5000 for i in range(200)}
    found = flaws(schema, answer)
    assert len(found) == MAX_PROBLEMS
    assert all(len(f.message) <= MESSAGE_CHARS for f in found)
    assert len(summary(found)) <= SUMMARY_CHARS


def test_required_output_is_the_short_form_of_an_object_with_those_keys() -> None:
    assert schema_of(None, ["a", "b"]) == {"type": "object", "required": ["a", "b"]}
    assert schema_of(None, []) == {}


def test_required_output_is_merged_with_the_output_schema() -> None:
    merged = schema_of({"type": "object", "required": ["a"]}, ["a", "b"])
    assert merged["required"] == ["a", "b"]


def _definition(state: str) -> str:
    body = textwrap.indent(textwrap.dedent(state).strip(), "  ")
    return f"""
type: contract_check
agent_type: cto
initial_state: CHECK
states:
{body}
  - name: DONE
    terminal: completed
  - name: FAILED
    terminal: failed
"""


def _check(*, schema: str, when: str, extra: str = "") -> str:
    return _definition(
        f"""
        - name: CHECK
          output_schema: {schema}
          {extra}
          on_success:
            - {{target: DONE, when: "{when}"}}
            - FAILED
          on_failure: FAILED
        """
    )


BOOLEAN = "{type: object, properties: {passed: {type: boolean}, score: {type: integer}}}"


def _problems(text: str) -> list[str]:
    with pytest.raises(DefinitionError) as caught:
        load_text(text)
    return [p.message for p in caught.value.problems]


def test_a_guard_reading_a_field_the_schema_does_not_declare_is_a_load_error() -> None:
    [problem] = _problems(_check(schema=BOOLEAN, when="output.pased == `true`"))
    assert "guard 'output.pased == `true`'" in problem
    assert "state CHECK" in problem
    assert "output.pased" in problem


def test_a_guard_comparing_a_boolean_with_a_string_is_a_load_error() -> None:
    [problem] = _problems(_check(schema=BOOLEAN, when="output.passed == 'yes'"))
    assert "guard \"output.passed == 'yes'\"" in problem or "output.passed == 'yes'" in problem
    assert "state CHECK" in problem
    assert "boolean" in problem and "string" in problem


@pytest.mark.parametrize(
    "when",
    [
        "output.passed == `true`",
        "output.passed",
        "output.score >= `3` && context.retryCount < `2`",
        "length(output.score) > `0` || output.passed",
    ],
)
def test_a_guard_that_holds_to_the_schema_loads(when: str) -> None:
    load_text(_check(schema=BOOLEAN, when=when))


def test_a_schema_without_properties_lets_a_guard_read_any_field() -> None:
    load_text(_check(schema="{type: object}", when="output.anything == 'x'"))


def test_an_invalid_schema_is_a_load_error_naming_the_state() -> None:
    text = _check(schema="{type: objekt}", when="output.passed")
    with pytest.raises(DefinitionError) as caught:
        load_text(text)
    [problem] = caught.value.problems
    assert problem.state == "CHECK"
    assert problem.field == "output_schema"
    assert "not a valid JSON Schema" in problem.message


def test_the_shipped_definitions_load_with_their_contracts() -> None:
    from fsm_celery.core.loader import SHIPPED_DEFINITIONS, definition_files, load_all

    loaded = load_all(definition_files(str(SHIPPED_DEFINITIONS)))
    guarded = [
        (d.type, s.name)
        for d in loaded
        for s in d.states
        if any(e.when and "output." in e.when for e in s.on_success)
    ]
    assert guarded
    for machine_type, name in guarded:
        state = next(d for d in loaded if d.type == machine_type).state(name)
        assert state.output_schema is not None, f"{machine_type}.{name} declares no contract"


# -- the refusal, a value -------------------------------------------------------------------


def _machine(corrections: int = 0) -> Machine:
    return Machine(uuid4(), "CHECK", MachineStatus.RUNNING, 1, 0, {}, corrections=corrections)


CONTRACT = load_text(_check(schema=BOOLEAN, when="output.passed == `true`", extra="max_retries: 1"))


def test_a_wrong_answer_is_refused_with_the_corrections_left() -> None:
    found = refusal(CONTRACT, _machine(), Ack("CHECK", 1, True, {"passed": 1}), Limits())
    assert found is not None
    assert (found.state, found.attempt, found.corrections_left) == ("CHECK", 1, 1)
    assert [f.pointer for f in found.flaws] == ["/passed"]


@pytest.mark.parametrize(
    ("ack", "corrections"),
    [
        (Ack("CHECK", 1, True, {"passed": True}), 0),  # holds to it
        (Ack("CHECK", 1, False, {"passed": 1}), 0),  # a failure is no answer to correct
        (Ack("CHECK", 0, True, {"passed": 1}), 0),  # stale: decide() rejects it
        (Ack("CHECK", 1, True, {"passed": 1}), 2),  # corrections used up: decide() fails it
    ],
)
def test_what_is_not_refused(ack: Ack, corrections: int) -> None:
    assert refusal(CONTRACT, _machine(corrections), ack, Limits()) is None


def test_the_state_bound_overrides_the_setting() -> None:
    definition = load_text(_check(schema=BOOLEAN, when="output.passed", extra="max_corrections: 0"))
    assert refusal(definition, _machine(), Ack("CHECK", 1, True, {"passed": 1}), Limits()) is None


def test_past_the_corrections_the_core_fails_the_attempt_as_invalid_output() -> None:
    decided: Any = decide(CONTRACT, _machine(2), Ack("CHECK", 1, True, {"passed": 1}))
    assert isinstance(decided, Transition)
    assert decided.failure is FailureKind.INVALID_OUTPUT
    assert (decided.to_state, decided.attempt) == ("CHECK", 2)  # its retry
    assert "breaks its contract: /passed" in (decided.error or "")
