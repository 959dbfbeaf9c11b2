"""The static validator: one test per rule, each naming the file, the state and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from fsm_celery.core.loader import definition_files, load_all, load_file, load_text
from fsm_celery.exceptions import DefinitionError, Problem

ROOT = Path(__file__).resolve().parents[2]
SOURCE = "machine.yaml"

GOOD = """
type: example
agent_type: cto
initial_state: A
states:
  - name: A
    prompt: Do {{ thing }}.
    timeout: 10
    on_success: B
    on_failure: FAILED
  - name: B
    on_success:
      - {target: DONE, when: output.ok}
      - {target: A, loop: true}
    on_failure: FAILED
  - name: DONE
    terminal: completed
  - name: FAILED
    terminal: failed
"""


def problems(text: str) -> list[Problem]:
    with pytest.raises(DefinitionError) as caught:
        load_text(text, SOURCE)
    return caught.value.problems


def only_problem(text: str) -> Problem:
    [problem] = problems(text)
    return problem


def test_a_good_definition_loads() -> None:
    definition = load_text(GOOD, SOURCE)
    assert [s.name for s in definition.states] == ["A", "B", "DONE", "FAILED"]


def test_the_shipped_definitions_are_valid() -> None:
    loaded = load_all(definition_files(ROOT / "definitions"))
    assert {d.type for d in loaded} == {
        "cto_build_project",
        "cto_fix_bug",
        "cto_infrastructure_check",
        "research_pipeline",
    }


def test_unknown_success_target() -> None:
    p = only_problem(GOOD.replace("on_success: B", "on_success: NOWHERE"))
    assert (p.source, p.state, p.field) == (SOURCE, "A", "on_success[0]")
    assert "unknown target state 'NOWHERE'" in p.message


def test_unknown_guarded_target() -> None:
    p = only_problem(
        GOOD.replace("{target: DONE, when: output.ok}", "{target: GONE, when: output.ok}")
    )
    assert (p.state, p.field) == ("B", "on_success[0]")
    assert "'GONE'" in p.message


def test_unknown_failure_target() -> None:
    text = GOOD.replace("    on_failure: FAILED\n  - name: B", "    on_failure: OOPS\n  - name: B")
    p = only_problem(text)
    assert (p.state, p.field) == ("A", "on_failure")


def test_unknown_loop_exhausted_target() -> None:
    p = only_problem(GOOD.replace("initial_state: A", "initial_state: A\non_loop_exhausted: X"))
    assert (p.state, p.field) == (None, "on_loop_exhausted")


def test_missing_initial_state() -> None:
    p = only_problem(GOOD.replace("initial_state: A", "initial_state: START"))
    assert (p.source, p.state, p.field) == (SOURCE, None, "initial_state")
    assert "'START' is not one of the states" in p.message


def test_initial_state_is_required() -> None:
    p = only_problem(GOOD.replace("initial_state: A\n", ""))
    assert (p.field, p.message) == ("initial_state", "Field required")


def test_unreachable_state() -> None:
    text = GOOD + "  - name: ORPHAN\n    on_success: DONE\n    on_failure: FAILED\n"
    p = only_problem(text)
    assert (p.state, p.message) == ("ORPHAN", "unreachable from the initial state")


def test_state_that_cannot_reach_a_terminal() -> None:
    text = GOOD.replace("on_success: B", "on_success: SINK") + (
        "  - name: SINK\n    on_success: SINK\n    on_failure: SINK\n"
    )
    found = {(p.state, p.message) for p in problems(text)}
    assert ("SINK", "cannot reach a terminal state") in found


def test_guard_that_does_not_compile() -> None:
    p = only_problem(GOOD.replace("when: output.ok", "when: 'output.[ok'"))
    assert (p.state, p.field) == ("B", "on_success[0]")
    assert "guard 'output.[ok' does not compile" in p.message


def test_zero_timeout() -> None:
    p = only_problem(GOOD.replace("timeout: 10", "timeout: 0"))
    assert (p.state, p.field) == ("A", "timeout")
    assert "timeout must be positive" in p.message


def test_negative_timeout() -> None:
    p = only_problem(GOOD.replace("timeout: 10", "timeout: -5"))
    assert (p.state, p.field, p.message) == ("A", "timeout", "timeout must be positive, got -5s")


def test_non_positive_heartbeat_timeout() -> None:
    p = only_problem(GOOD.replace("timeout: 10", "timeout: 10\n    heartbeat_timeout: 0"))
    assert (p.state, p.field) == ("A", "heartbeat_timeout")


def test_duplicate_state_names() -> None:
    text = GOOD + "  - name: A\n    terminal: completed\n"
    p = problems(text)[0]
    assert (p.state, p.field, p.message) == ("A", "name", "duplicate state name 'A'")


def test_duplicate_yaml_keys() -> None:
    p = only_problem(GOOD.replace("    timeout: 10\n", "    timeout: 10\n    timeout: 20\n"))
    assert p.source == SOURCE
    assert "duplicate key 'timeout'" in p.message


def test_cycle_without_a_loop_edge_is_unbounded() -> None:
    p = only_problem(GOOD.replace("{target: A, loop: true}", "{target: A}"))
    assert "has no edge marked loop: true" in p.message


def test_last_success_edge_must_be_a_default() -> None:
    text = GOOD.replace("{target: A, loop: true}", "{target: A, loop: true, when: output.no}")
    p = only_problem(text)
    assert (p.state, p.field) == ("B", "on_success")
    assert "must have no guard" in p.message


def test_terminal_state_has_no_edges() -> None:
    text = GOOD.replace("terminal: completed", "terminal: completed\n    on_success: FAILED")
    p = only_problem(text)
    assert (p.state, p.field, p.message) == ("DONE", "on_success", "a terminal state has no edges")


def test_non_terminal_state_needs_both_edges() -> None:
    text = GOOD.replace("    on_success: B\n    on_failure: FAILED\n", "")
    found = {(p.state, p.field) for p in problems(text)}
    assert {("A", "on_success"), ("A", "on_failure")} <= found


def test_no_terminal_state() -> None:
    text = """
type: endless
agent_type: cto
initial_state: A
on_loop_exhausted: A
states:
  - {name: A, on_success: {target: A, loop: true}, on_failure: {target: A, loop: true}}
"""
    found = {(p.field, p.message) for p in problems(text)}
    assert ("states", "no terminal state (terminal: completed|failed)") in found


def test_prompt_template_that_does_not_compile() -> None:
    p = only_problem(GOOD.replace("Do {{ thing }}.", "Do {{ thing }."))
    assert (p.state, p.field) == ("A", "prompt")
    assert "prompt template does not compile" in p.message


def test_wrong_type_names_the_state_and_field() -> None:
    p = only_problem(GOOD.replace("timeout: 10", "timeout: 10\n    max_retries: many"))
    assert (p.state, p.field) == ("A", "max_retries")


def test_unknown_field_is_refused() -> None:
    p = only_problem(GOOD.replace("timeout: 10", "timeout: 10\n    retries: 3"))
    assert (p.state, p.field, p.message) == ("A", "retries", "Extra inputs are not permitted")


def test_invalid_yaml() -> None:
    p = only_problem("type: [unclosed")
    assert p.source == SOURCE and p.message.startswith("invalid YAML")


def test_document_that_is_not_a_mapping() -> None:
    assert only_problem("- just\n- a list\n").message == "a definition must be a mapping"


def test_same_type_in_two_files(tmp_path: Path) -> None:
    for name in ("one.yaml", "two.yaml"):
        (tmp_path / name).write_text(GOOD)
    with pytest.raises(DefinitionError) as caught:
        load_all(definition_files(tmp_path))
    assert [p.message for p in caught.value.problems] == [
        "machine type 'example' is defined more than once"
    ]


def test_problems_of_every_file_are_reported_together(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(GOOD.replace("timeout: 10", "timeout: 0"))
    (tmp_path / "b.yaml").write_text("type: [")
    with pytest.raises(DefinitionError) as caught:
        load_all(definition_files(tmp_path))
    assert {Path(p.source).name for p in caught.value.problems} == {"a.yaml", "b.yaml"}


def test_unreadable_file_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    with pytest.raises(DefinitionError, match="cannot read"):
        load_file(tmp_path / "missing.yaml")


def test_round_trip_through_json_keeps_content_and_digest() -> None:
    from fsm_celery.core.loader import parse_definition

    definition = load_text(GOOD, SOURCE)
    again = parse_definition(definition.to_json())
    assert again == definition
    assert again.digest() == definition.digest()


def test_digest_changes_with_content() -> None:
    assert (
        load_text(GOOD).digest() != load_text(GOOD.replace("timeout: 10", "timeout: 11")).digest()
    )
