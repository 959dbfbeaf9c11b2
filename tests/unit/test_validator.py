"""The loader and the static validator: one test per rule, each naming file, state and field."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest

from fsm_celery.core.definition import MachineDefinition
from fsm_celery.core.loader import (
    SHIPPED_DEFINITIONS,
    definition_files,
    load_all,
    load_file,
    load_text,
    parse_definition,
    read_yaml,
)
from fsm_celery.core.validator import validate
from fsm_celery.exceptions import DefinitionError, Problem
from tests.support import definitions

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = definition_files(SHIPPED_DEFINITIONS)
SOURCE = "machine.yaml"

# A small valid machine; each test breaks one thing in it.
GOOD = """\
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


def edit(old: str, new: str, text: str = GOOD) -> str:
    """The text with exactly one occurrence of old replaced (so a typo cannot pass silently)."""
    assert text.count(old) == 1, f"{old!r} occurs {text.count(old)} times"
    return text.replace(old, new)


problems = partial(definitions.problems, source=SOURCE)
only_problem = partial(definitions.only_problem, source=SOURCE)
assert_problem = partial(definitions.assert_problem, source=SOURCE)


# -- valid definitions ------------------------------------------------------------------------


def test_a_good_definition_loads() -> None:
    definition = load_text(GOOD, SOURCE)
    assert [s.name for s in definition.states] == ["A", "B", "DONE", "FAILED"]
    assert definition.state("B").on_success[1].loop


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_each_shipped_definition_validates(path: Path) -> None:
    definition = load_file(path)
    validate(definition, path.name)  # validating again finds nothing either
    assert definition.type == path.stem


def test_the_shipped_definitions_load_together() -> None:
    assert {d.type for d in load_all(SHIPPED)} == {
        "cto_build_parallel",
        "cto_build_project",
        "cto_fix_bug",
        "cto_infrastructure_check",
        "research_fanout",
        "research_pipeline",
    }


def test_on_loop_exhausted_is_not_checked_when_no_edge_loops() -> None:
    text = edit("      - {target: A, loop: true}\n", "      - {target: FAILED}\n")
    definition = load_text(edit("initial_state: A", "initial_state: A\non_loop_exhausted: X", text))
    assert definition.on_loop_exhausted == "X"


# -- unknown targets --------------------------------------------------------------------------


def test_unknown_on_success_target() -> None:
    p = only_problem(edit("on_success: B", "on_success: NOWHERE"))
    assert_problem(p, "A", "on_success[0]", "unknown target state 'NOWHERE'")


def test_unknown_target_of_a_guarded_edge() -> None:
    p = only_problem(edit("{target: DONE, when: output.ok}", "{target: GONE, when: output.ok}"))
    assert_problem(p, "B", "on_success[0]", "unknown target state 'GONE'")


def test_unknown_target_of_the_default_edge_after_a_guarded_one() -> None:
    p = only_problem(edit("{target: A, loop: true}", "{target: AA, loop: true}"))
    assert_problem(p, "B", "on_success[1]", "unknown target state 'AA'")


def test_unknown_on_failure_target() -> None:
    p = only_problem(
        edit("    on_failure: FAILED\n  - name: B", "    on_failure: OOPS\n  - name: B")
    )
    assert_problem(p, "A", "on_failure", "unknown target state 'OOPS'")


def test_unknown_on_loop_exhausted_target() -> None:
    p = only_problem(edit("initial_state: A", "initial_state: A\non_loop_exhausted: X"))
    assert_problem(p, None, "on_loop_exhausted", "target 'X' is not one of the states")


# -- the graph --------------------------------------------------------------------------------


def test_initial_state_that_is_not_a_state() -> None:
    p = only_problem(edit("initial_state: A", "initial_state: START"))
    assert_problem(p, None, "initial_state", "initial state 'START' is not one of the states")


def test_initial_state_is_required() -> None:
    p = only_problem(edit("initial_state: A\n", ""))
    assert p == Problem("Field required", SOURCE, None, "initial_state")


def test_unreachable_state() -> None:
    p = only_problem(GOOD + "  - name: ORPHAN\n    on_success: DONE\n    on_failure: FAILED\n")
    assert p == Problem("unreachable from the initial state", SOURCE, "ORPHAN", None)


def test_state_that_cannot_reach_a_terminal() -> None:
    text = edit("    on_failure: FAILED\n  - name: DONE", "    on_failure: SINK\n  - name: DONE")
    text += "  - name: SINK\n    on_success: SINK\n    on_failure: SINK\n"
    found = problems(text)
    assert Problem("cannot reach a terminal state", SOURCE, "SINK", None) in found
    assert {p.state for p in found if "cannot reach" in p.message} == {"SINK"}


def test_no_terminal_state_at_all() -> None:
    text = """
type: endless
agent_type: cto
initial_state: A
on_loop_exhausted: A
states:
  - {name: A, on_success: {target: A, loop: true}, on_failure: {target: A, loop: true}}
"""
    found = problems(text)  # on_loop_exhausted: A is refused too: it is not terminal
    assert (
        Problem("no terminal state (terminal: completed|failed)", SOURCE, None, "states") in found
    )


def test_cycle_without_a_loop_edge() -> None:
    p = only_problem(edit("{target: A, loop: true}", "{target: A}"))
    assert_problem(p, "B", None, "cycle through 'A' has no edge marked loop: true")


def test_self_cycle_on_failure_without_a_loop_edge() -> None:
    p = only_problem(edit("    on_failure: FAILED\n  - name: B", "    on_failure: A\n  - name: B"))
    assert_problem(p, "A", None, "cycle through 'A' has no edge marked loop: true")


def test_loop_exhausted_state_that_leads_back_into_the_loop_is_refused() -> None:
    # Once retryCount passes maxRetries every loop edge leads to on_loop_exhausted; if that state
    # can take the loop edge again the machine cycles A -> B -> A forever, unbounded.
    text = """
type: loopy
agent_type: cto
initial_state: A
on_loop_exhausted: A
states:
  - {name: A, on_success: B, on_failure: DONE}
  - {name: B, on_success: {target: A, loop: true}, on_failure: DONE}
  - {name: DONE, terminal: completed}
"""
    p = only_problem(text)
    assert_problem(p, None, "on_loop_exhausted", "must be a terminal state, 'A' is not")


# -- edges of one state -----------------------------------------------------------------------


def test_last_on_success_edge_must_be_unguarded() -> None:
    p = only_problem(edit("{target: A, loop: true}", "{target: A, loop: true, when: output.no}"))
    assert_problem(p, "B", "on_success", "the last on_success edge must have no guard")


def test_single_guarded_on_success_edge_has_no_default() -> None:
    p = only_problem(edit("on_success: B", "on_success: {target: B, when: output.go}"))
    assert_problem(p, "A", "on_success", "must have no guard (it is the default)")


def test_terminal_state_with_an_on_success_edge() -> None:
    p = only_problem(edit("terminal: completed", "terminal: completed\n    on_success: FAILED"))
    assert p == Problem("a terminal state has no edges", SOURCE, "DONE", "on_success")


def test_terminal_state_with_an_on_failure_edge_names_on_failure() -> None:
    found = problems(edit("terminal: completed", "terminal: completed\n    on_failure: FAILED"))
    assert Problem("a terminal state has no edges", SOURCE, "DONE", "on_failure") in found


def test_non_terminal_state_without_on_success() -> None:
    p = only_problem(edit("    on_success: B\n    on_failure: FAILED\n", "    on_failure: B\n"))
    assert p == Problem("a non-terminal state needs on_success", SOURCE, "A", "on_success")


def test_non_terminal_state_without_on_failure() -> None:
    p = only_problem(edit("    on_failure: FAILED\n  - name: B", "  - name: B"))
    assert p == Problem("a non-terminal state needs on_failure", SOURCE, "A", "on_failure")


def test_guard_that_does_not_compile() -> None:
    p = only_problem(edit("when: output.ok", "when: 'output.[ok'"))
    assert p.message == (
        "guard 'output.[ok' does not compile: Invalid jmespath expression: Incomplete expression"
    )
    assert_problem(p, "B", "on_success[0]", "guard 'output.[ok' does not compile")


# -- per-state settings -----------------------------------------------------------------------


def test_zero_timeout() -> None:
    p = only_problem(edit("timeout: 10", "timeout: 0"))
    assert p == Problem("timeout must be positive, got 0s", SOURCE, "A", "timeout")


def test_negative_timeout() -> None:
    p = only_problem(edit("timeout: 10", "timeout: -5"))
    assert p == Problem("timeout must be positive, got -5s", SOURCE, "A", "timeout")


def test_non_positive_heartbeat_timeout() -> None:
    p = only_problem(edit("timeout: 10", "timeout: 10\n    heartbeat_timeout: 0"))
    assert p == Problem("heartbeat_timeout must be positive", SOURCE, "A", "heartbeat_timeout")


def test_backoff_delay_above_its_cap() -> None:
    p = only_problem(edit("timeout: 10", "timeout: 10\n    backoff: {delay: 60, max_delay: 5}"))
    assert p == Problem("backoff needs 0 <= delay <= max_delay", SOURCE, "A", "backoff")


@pytest.mark.parametrize(
    ("field", "text"),
    [
        ("timeout", "timeout: 2592001"),
        ("max_duration", "timeout: 10\n    max_duration: 5184000"),  # 60 days
        ("heartbeat_timeout", "timeout: 10\n    heartbeat_timeout: 2592001"),
        ("backoff", "timeout: 10\n    backoff: {delay: 1, max_delay: 2592001}"),
    ],
)
def test_a_wait_past_30_days_is_refused(field: str, text: str) -> None:
    p = only_problem(edit("timeout: 10", text))
    assert p == Problem(f"{field} must be at most 30 days (2592000s)", SOURCE, "A", field)


def test_a_wait_of_30_days_is_accepted() -> None:
    text = edit("timeout: 10", "timeout: 2592000\n    max_duration: 2592000")
    state = load_text(text, SOURCE).state("A")
    assert (state.timeout.days, state.max_duration) == (30, state.timeout)


def test_a_stored_version_past_a_newer_bound_is_still_read() -> None:
    body = load_text(GOOD).to_json()
    body["states"][0]["timeout"] = 60 * 86_400.0
    with pytest.raises(DefinitionError):
        parse_definition(body, SOURCE)
    assert parse_definition(body, SOURCE, check=False).states[0].timeout.days == 60


def test_prompt_template_that_does_not_compile() -> None:
    p = only_problem(edit("Do {{ thing }}.", "Do {{ thing }."))
    assert_problem(p, "A", "prompt", "prompt template does not compile")


def test_duplicate_state_names() -> None:
    found = problems(GOOD + "  - name: A\n    terminal: completed\n")
    assert found[0] == Problem("duplicate state name 'A'", SOURCE, "A", "name")


# -- pydantic errors, mapped to the state ------------------------------------------------------


def test_wrong_type_for_max_retries_names_the_state_and_field() -> None:
    p = only_problem(edit("timeout: 10", "timeout: 10\n    max_retries: many"))
    assert_problem(p, "A", "max_retries", "valid integer")


def test_negative_max_retries_names_the_state_and_field() -> None:
    p = only_problem(edit("timeout: 10", "timeout: 10\n    max_retries: -1"))
    assert_problem(p, "A", "max_retries", "greater than or equal to 0")


def test_wrong_type_inside_an_edge_names_the_edge() -> None:
    p = only_problem(edit("{target: A, loop: true}", "{target: A, loop: maybe}"))
    assert_problem(p, "B", "on_success.1.loop", "valid boolean")


def test_unknown_terminal_kind_names_the_state() -> None:
    p = only_problem(edit("terminal: failed", "terminal: crashed"))
    assert_problem(p, "FAILED", "terminal", "'completed' or 'failed'")


def test_unknown_state_field_is_refused() -> None:
    p = only_problem(edit("timeout: 10", "timeout: 10\n    retries: 3"))
    assert p == Problem("Extra inputs are not permitted", SOURCE, "A", "retries")


def test_invalid_state_name_names_the_state() -> None:
    p = only_problem(GOOD + "  - name: 9lives\n    terminal: failed\n")
    assert_problem(p, "9lives", "name", "should match pattern")


def test_state_that_is_not_a_mapping_is_named_by_position() -> None:
    p = only_problem(GOOD + "  - just a string\n")
    assert (p.source, p.state, p.field) == (SOURCE, "#5", None)


def test_wrong_top_level_value_names_no_state() -> None:
    p = only_problem(edit("initial_state: A", "initial_state: A\nmax_loops: -1"))
    assert_problem(p, None, "max_loops", "greater than or equal to 0")


def test_empty_state_list() -> None:
    p = only_problem("type: t\nagent_type: cto\ninitial_state: A\nstates: []\n")
    assert_problem(p, None, "states", "at least 1 item")


# -- YAML and files ---------------------------------------------------------------------------


def test_duplicate_key_in_a_state() -> None:
    p = only_problem(edit("    timeout: 10\n", "    timeout: 10\n    timeout: 20\n"))
    assert_problem(p, None, None, "duplicate key 'timeout'")
    assert (p.line, p.column) == (8, 5)
    assert str(p) == "machine.yaml:8:5: invalid YAML: duplicate key 'timeout'"


def test_an_alias_is_refused_where_it_is_used() -> None:
    p = only_problem(GOOD + "x-shared: &shared {a: 1}\nx-again: *shared\n")
    assert_problem(p, None, None, "aliases (*shared) are not allowed in definitions")
    assert p.line == GOOD.count("\n") + 2


def test_duplicate_top_level_key() -> None:
    p = only_problem(edit("initial_state: A", "initial_state: A\ninitial_state: B"))
    assert_problem(p, None, None, "duplicate key 'initial_state'")


def test_invalid_yaml() -> None:
    p = only_problem("type: [unclosed")
    assert_problem(p, None, None, "invalid YAML")


def test_yaml_with_an_unhashable_key_is_a_definition_error() -> None:
    p = only_problem(GOOD + "? [a, b]\n: 1\n")
    assert_problem(p, None, None, "invalid YAML")


@pytest.mark.parametrize("text", ["- just\n- a list\n", "just a string\n", ""])
def test_document_that_is_not_a_mapping(text: str) -> None:
    assert only_problem(text) == Problem("a definition must be a mapping", SOURCE)


def test_load_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(edit("timeout: 10", "timeout: 0"))
    with pytest.raises(DefinitionError) as caught:
        load_file(path)
    assert caught.value.problems == [
        Problem("timeout must be positive, got 0s", str(path), "A", "timeout")
    ]
    assert str(path) in str(caught.value)


def test_unreadable_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    with pytest.raises(DefinitionError) as caught:
        load_file(missing)
    [p] = caught.value.problems
    assert (p.source, p.state, p.field) == (str(missing), None, None)
    assert p.message.startswith("cannot read")


def test_same_type_defined_twice_in_load_all(tmp_path: Path) -> None:
    for name in ("one.yaml", "two.yaml"):
        (tmp_path / name).write_text(GOOD)
    with pytest.raises(DefinitionError) as caught:
        load_all(definition_files(tmp_path))
    [problem] = caught.value.problems
    assert problem.message == (
        f"machine type 'example' is defined more than once: {tmp_path / 'one.yaml'}, "
        f"{tmp_path / 'two.yaml'}"
    )


def test_same_type_defined_twice_names_both_files(tmp_path: Path) -> None:
    for name in ("one.yaml", "two.yaml"):
        (tmp_path / name).write_text(GOOD)
    with pytest.raises(DefinitionError) as caught:
        load_all(definition_files(tmp_path))
    assert "one.yaml" in str(caught.value) and "two.yaml" in str(caught.value)


def test_load_all_reports_the_problems_of_every_file(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(edit("timeout: 10", "timeout: 0"))
    (tmp_path / "b.yaml").write_text("type: [")
    with pytest.raises(DefinitionError) as caught:
        load_all(definition_files(tmp_path))
    assert [Path(p.source).name for p in caught.value.problems] == ["a.yaml", "b.yaml"]


def test_validator_reports_every_problem_at_once() -> None:
    text = edit("timeout: 10", "timeout: 0", edit("Do {{ thing }}.", "Do {{ thing }."))
    assert {(p.state, p.field) for p in problems(text)} == {("A", "timeout"), ("A", "prompt")}


def test_validate_raises_with_the_given_source() -> None:
    data = load_text(GOOD).to_json()
    data["initial_state"] = "NOPE"
    with pytest.raises(DefinitionError) as caught:
        validate(MachineDefinition.model_validate(data), "other.yaml")
    assert [(p.source, p.field) for p in caught.value.problems] == [("other.yaml", "initial_state")]


# -- JSON round trip and digest ---------------------------------------------------------------


def test_definition_round_trips_through_json() -> None:
    definition = load_text(GOOD, SOURCE)
    again = parse_definition(json.loads(json.dumps(definition.to_json())))
    assert again == definition
    assert again.digest() == definition.digest()


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_definition_round_trips_through_json(path: Path) -> None:
    definition = load_file(path)
    again = parse_definition(json.loads(json.dumps(definition.to_json())))
    assert again == definition
    assert again.digest() == definition.digest()


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("timeout: 10", "timeout: 11"),
        ("when: output.ok", "when: output.okay"),
        ("Do {{ thing }}.", "Do {{ thing }}!"),
        ("prompt: Do", "description: new\n    prompt: Do"),
        ("initial_state: A", "initial_state: A\nmax_loops: 4"),
    ],
)
def test_digest_changes_when_content_changes(old: str, new: str) -> None:
    assert load_text(GOOD).digest() != load_text(edit(old, new)).digest()


def test_digest_ignores_comments_key_order_and_spelled_out_defaults() -> None:
    text = edit("type: example\nagent_type: cto\n", "# a comment\nagent_type: cto\ntype: example\n")
    text = edit("timeout: 10", "timeout: 10\n    max_retries: 0", text)
    assert load_text(text).digest() == load_text(GOOD).digest()


def test_failure_edge_with_a_guard_is_refused() -> None:
    found = problems(
        edit(
            "    on_failure: FAILED\n  - name: B",
            "    on_failure: {target: FAILED, when: output.ok}\n  - name: B",
        )
    )
    assert Problem("a failure edge takes no guard (when:)", SOURCE, "A", "on_failure") in found


def test_a_definition_names_the_agent_types_of_its_states_and_inline_children() -> None:
    named = {d.type: d.agent_types_named() for d in load_all(SHIPPED)}
    assert named["research_fanout"] == {"analyzer", "researcher", "reviewer"}
    assert named["cto_build_parallel"] == {"cto", "tester", "docwriter"}
    assert named["cto_fix_bug"] == {"cto"}


def test_notify_on_is_a_key_not_a_yaml_1_1_boolean() -> None:
    text = GOOD + "notify:\n  url: https://hooks.example.com/fsm\n  on: [completed, failed]\n"
    notify = load_text(text).notify
    assert notify is not None and notify.on == ("completed", "failed")


def test_only_true_and_false_are_booleans_and_a_boolean_field_takes_yes_too() -> None:
    assert read_yaml("a: yes\nb: on\nc: true\nd: False\n") == {
        "a": "yes",
        "b": "on",
        "c": True,
        "d": False,
    }
    text = GOOD.replace("{target: A, loop: true}", "{target: A, loop: yes}")
    assert load_text(text).state("B").on_success[1].loop is True
