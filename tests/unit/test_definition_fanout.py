"""The fan-out syntax of a definition (parallel, map, machine) and the validator's refusals of
it: each one line, naming the state (and, inside an inline body, the path to it)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest

from fsm_celery.core.definition import Body, MachineDefinition, ParentCancel
from fsm_celery.core.fanout_validator import tree_problems
from fsm_celery.core.loader import SHIPPED_DEFINITIONS, definition_files, load_all, load_text
from fsm_celery.exceptions import Problem
from tests.support import definitions

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "definitions"
SOURCE = "fan.yaml"

# A valid parallel state: an inline branch, and a branch that runs another definition.
PARALLEL = """\
type: fan
agent_type: cto
initial_state: FAN
states:
  - name: FAN
    parallel:
      branches:
        - name: tests
          agent_type: writer
          initial_state: GO
          states:
            - {name: GO, on_success: DONE, on_failure: FAILED}
            - {name: DONE, terminal: completed}
            - {name: FAILED, terminal: failed}
        - name: docs
          machine: other
    on_success: DONE
    on_failure: FAILED
  - {name: DONE, terminal: completed}
  - {name: FAILED, terminal: failed}
"""

# A valid map over context.items, two at a time.
MAP = """\
type: each
agent_type: cto
initial_state: EACH
states:
  - name: EACH
    map:
      items: context.items
      max_concurrency: 2
      initial_state: GO
      states:
        - {name: GO, on_success: DONE, on_failure: FAILED}
        - {name: DONE, terminal: completed}
        - {name: FAILED, terminal: failed}
    on_success: DONE
    on_failure: FAILED
  - {name: DONE, terminal: completed}
  - {name: FAILED, terminal: failed}
"""

# A valid state that runs one machine of another definition.
MACHINE = """\
type: delegate
agent_type: cto
initial_state: DELEGATE
states:
  - name: DELEGATE
    machine: other
    on_success: DONE
    on_failure: FAILED
  - {name: DONE, terminal: completed}
  - {name: FAILED, terminal: failed}
"""

# One machine with no children, to be started by the others.
OTHER = """\
type: other
agent_type: cto
initial_state: WORK
states:
  - {name: WORK, on_success: DONE, on_failure: FAILED}
  - {name: DONE, terminal: completed}
  - {name: FAILED, terminal: failed}
"""


def edit(text: str, old: str, new: str) -> str:
    """The text with exactly one occurrence of old replaced (so a typo cannot pass silently)."""
    assert text.count(old) == 1, f"{old!r} occurs {text.count(old)} times"
    return text.replace(old, new)


def nested(children: str) -> str:
    """PARALLEL with the state GO of its branch tests fanning out in turn: children are the
    lines of GO's parallel, map or machine."""
    go = "            - name: GO\n" + children
    go += "              on_success: DONE\n              on_failure: FAILED\n"
    return edit(PARALLEL, "            - {name: GO, on_success: DONE, on_failure: FAILED}\n", go)


problems = partial(definitions.problems, source=SOURCE, one_line=True)
only_problem = partial(definitions.only_problem, source=SOURCE, one_line=True)
assert_problem = partial(definitions.assert_problem, source=SOURCE)


def loaded(*texts: str) -> dict[str, MachineDefinition]:
    return {d.type: d for d in (load_text(text, SOURCE) for text in texts)}


# -- what loads ---------------------------------------------------------------------------------


@pytest.mark.parametrize("text", [PARALLEL, MAP, MACHINE], ids=["parallel", "map", "machine"])
def test_a_fan_out_state_loads(text: str) -> None:
    assert load_text(text, SOURCE).states[0].fans_out


def test_the_shipped_and_fixture_definitions_still_load_and_make_a_sound_tree() -> None:
    definitions = load_all([*definition_files(SHIPPED_DEFINITIONS), *definition_files(FIXTURES)])
    assert list(tree_problems({d.type: d for d in definitions}, max_depth=5)) == []


def test_a_map_bounded_by_its_context_schema_needs_no_max_concurrency() -> None:
    text = edit(MAP, "      max_concurrency: 2\n", "")
    text = edit(
        text,
        "initial_state: EACH\n",
        "initial_state: EACH\n"
        "context_schema: {properties: {items: {type: array, maxItems: 500}}}\n",
    )
    assert load_text(text, SOURCE).state("EACH").map is not None


def test_join_at_least_as_many_as_the_branches_loads() -> None:
    text = edit(PARALLEL, "      branches:", "      join: {at_least: 2}\n      branches:")
    assert load_text(text, SOURCE).state("FAN").parallel is not None


# -- _fanout_problems ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [("input", "context.x"), ("output", "[x]"), ("on_parent_cancel", "abandon")],
)
def test_a_state_without_children_refuses_their_settings(field: str, value: str) -> None:
    text = edit(OTHER, "{name: WORK,", f"{{name: WORK, {field}: {value},")
    p = only_problem(text)
    assert_problem(p, "WORK", field, f"{field} applies to a state with children")


def test_a_state_has_one_kind_of_children() -> None:
    p = only_problem(edit(PARALLEL, "    parallel:", "    machine: other\n    parallel:"))
    assert_problem(p, "FAN", None, "a state has one kind of children, not parallel and machine")


# -- _kind_problems -----------------------------------------------------------------------------


def test_a_terminal_state_starts_no_children() -> None:
    p = only_problem(
        edit(
            MACHINE,
            "{name: DONE, terminal: completed}",
            "{name: DONE, terminal: completed, machine: other}",
        )
    )
    assert_problem(p, "DONE", "machine", "a terminal state starts no children (machine)")


@pytest.mark.parametrize(
    ("text", "state", "kind"),
    [(PARALLEL, "FAN", "parallel"), (MAP, "EACH", "map"), (MACHINE, "DELEGATE", "machine")],
)
def test_a_state_with_children_has_no_prompt(text: str, state: str, kind: str) -> None:
    p = only_problem(edit(text, f"  - name: {state}\n", f"  - name: {state}\n    prompt: Go.\n"))
    assert_problem(p, state, "prompt", f"a {kind} state has no prompt: its children do the work")


@pytest.mark.parametrize(
    ("text", "state", "kind"), [(PARALLEL, "FAN", "parallel"), (MAP, "EACH", "map")]
)
@pytest.mark.parametrize(("field", "value"), [("input", "context"), ("output", "[x]")])
def test_input_and_output_go_on_the_bodies_of_a_parallel_or_map_state(
    text: str, state: str, kind: str, field: str, value: str
) -> None:
    p = only_problem(
        edit(text, f"  - name: {state}\n", f"  - name: {state}\n    {field}: {value}\n")
    )
    assert_problem(p, state, field, f"{field} goes on each of the {kind}'s bodies")


def test_a_machine_state_takes_its_input_and_output() -> None:
    text = edit(
        MACHINE,
        "    machine: other\n",
        "    machine: other\n    input: {a: context.a}\n    output: [b]\n",
    )
    state = load_text(text, SOURCE).state("DELEGATE")
    assert (state.input, state.output) == ({"a": "context.a"}, ("b",))


# -- _parallel_problems -------------------------------------------------------------------------


def test_branch_names_are_unique() -> None:
    # the second runs a machine: checking the inline states of "tests" must not find its body
    p = only_problem(edit(PARALLEL, "- name: docs", "- name: tests"))
    assert_problem(p, "FAN", "parallel.branches", "duplicate branch name 'tests'")


def test_a_branch_may_not_write_over_the_loop_counter() -> None:
    p = only_problem(edit(PARALLEL, "- name: docs", "- name: retryCount"))
    assert_problem(p, "FAN", "parallel.branches", "branch 'retryCount' would write its output over")


def test_join_at_least_more_than_the_branches_is_refused() -> None:
    p = only_problem(
        edit(PARALLEL, "      branches:", "      join: {at_least: 3}\n      branches:")
    )
    assert_problem(p, "FAN", "parallel.join", "join at_least: 3 is more than the 2 branches")


@pytest.mark.parametrize("join", ["any", "{at_least: 1}"])
def test_tolerated_failures_apply_to_join_all_only(join: str) -> None:
    text = edit(
        PARALLEL,
        "      branches:",
        f"      join: {join}\n      tolerated_failures: 1\n      branches:",
    )
    p = only_problem(text)
    assert_problem(
        p, "FAN", "parallel.tolerated_failures", "tolerated_failures applies to join: all"
    )


def test_tolerating_every_branch_failing_is_refused() -> None:
    p = only_problem(
        edit(PARALLEL, "      branches:", "      tolerated_failures: 2\n      branches:")
    )
    assert_problem(
        p,
        "FAN",
        "parallel.tolerated_failures",
        "tolerated_failures 2 tolerates every branch failing",
    )


# -- _map_problems ------------------------------------------------------------------------------


def test_a_map_over_items_that_do_not_compile_is_refused_in_one_line() -> None:
    p = only_problem(edit(MAP, "items: context.items", "items: 'context.['"))
    assert_problem(p, "EACH", "map.items", "items 'context.[' does not compile")
    assert p.message.endswith(
        "does not compile: Invalid jmespath expression: Incomplete expression"
    )


def test_an_unbounded_map_needs_max_concurrency() -> None:
    p = only_problem(edit(MAP, "      max_concurrency: 2\n", ""))
    assert_problem(
        p, "EACH", "map.max_concurrency", "needs max_concurrency: nothing bounds the list"
    )


def test_a_map_over_items_written_on_lines_is_refused_in_one_line() -> None:
    text = edit(MAP, "      max_concurrency: 2\n", "")
    p = only_problem(edit(text, "items: context.items\n", "items: |\n        context.items\n"))
    assert p.message.startswith("map over context.items needs max_concurrency")


def test_a_schema_property_without_max_items_does_not_bound_a_map() -> None:
    text = edit(MAP, "      max_concurrency: 2\n", "")
    text = edit(
        text,
        "initial_state: EACH\n",
        "initial_state: EACH\ncontext_schema: {properties: {items: {type: array}}}\n",
    )
    assert_problem(only_problem(text), "EACH", "map.max_concurrency", "needs max_concurrency")


@pytest.mark.parametrize(
    ("result_key", "schema", "fragment"),
    [
        ("retryCount", "", "would write over the engine's loop counter"),
        ("items", "", "would write the results over the list they come from (context.items)"),
        (
            "answers",
            "context_schema: {properties: {answers: {type: string}}}\n",
            "is a property of the context_schema: the results would write over it",
        ),
    ],
    ids=["loop counter", "the list", "a schema property"],
)
def test_a_result_key_that_clashes_with_the_context_is_refused(
    result_key: str, schema: str, fragment: str
) -> None:
    text = edit(
        MAP,
        "      max_concurrency: 2\n",
        f"      max_concurrency: 2\n      result_key: {result_key}\n",
    )
    text = edit(text, "initial_state: EACH\n", f"initial_state: EACH\n{schema}")
    p = only_problem(text)
    assert_problem(p, "EACH", "map.result_key", f"result_key {result_key!r} {fragment}")


def test_a_map_without_result_key_clashes_by_its_state_name() -> None:
    text = edit(
        MAP,
        "initial_state: EACH\n",
        "initial_state: EACH\ncontext_schema: {properties: {EACH: {}}}\n",
    )
    assert_problem(only_problem(text), "EACH", "map.result_key", "result_key 'EACH' is a property")


# -- _body_problems -----------------------------------------------------------------------------


def test_a_branch_runs_a_machine_or_states_not_both() -> None:
    p = only_problem(
        edit(
            PARALLEL,
            "          machine: other\n",
            "          machine: other\n          initial_state: GO\n",
        )
    )
    assert_problem(
        p,
        "FAN.docs",
        "parallel.branches",
        "a body runs a machine or states of its own, not both (initial_state)",
    )


def test_a_branch_needs_a_machine_or_states() -> None:
    p = only_problem(edit(PARALLEL, "          machine: other\n", ""))
    assert_problem(
        p, "FAN.docs", "parallel.branches", "a body needs states and initial_state, or machine:"
    )


def test_a_map_body_needs_a_machine_or_states() -> None:
    p = only_problem(edit(MAP, "      initial_state: GO\n", ""))
    assert_problem(p, "EACH", "map", "a body needs states and initial_state, or machine:")


def test_a_map_body_runs_a_machine_or_states_not_both() -> None:
    p = only_problem(
        edit(MAP, "      initial_state: GO\n", "      machine: other\n      initial_state: GO\n")
    )
    assert_problem(p, "EACH", "map", "not both (initial_state, states)")


def test_a_problem_of_an_inline_state_names_its_path() -> None:
    p = only_problem(
        edit(PARALLEL, "{name: GO, on_success: DONE,", "{name: GO, on_success: NOWHERE,")
    )
    assert_problem(p, "FAN.tests.GO", "on_success[0]", "unknown target state 'NOWHERE'")


def test_a_problem_of_an_inline_body_as_a_whole_names_its_branch() -> None:
    p = only_problem(
        edit(PARALLEL, "          initial_state: GO\n", "          initial_state: START\n")
    )
    assert_problem(
        p, "FAN.tests", "initial_state", "initial state 'START' is not one of the states"
    )


def test_a_problem_of_a_map_body_names_the_map_state() -> None:
    p = only_problem(edit(MAP, "{name: GO, on_success", "{name: GO, timeout: 0, on_success"))
    assert_problem(p, "EACH.GO", "timeout", "timeout must be positive")


def test_a_problem_two_levels_down_names_the_whole_path() -> None:
    inner = (
        "                branches:\n"
        "                  - name: deep\n"
        "                    initial_state: X\n"
        "                    states:\n"
        "                      - {name: X, timeout: 0, on_success: Y, on_failure: Y}\n"
        "                      - {name: Y, terminal: completed}\n"
    )
    p = only_problem(nested("              parallel:\n" + inner))
    assert_problem(p, "FAN.tests.GO.deep.X", "timeout", "timeout must be positive")


# -- _input_problems ----------------------------------------------------------------------------


def test_a_branch_input_that_does_not_compile_is_refused_in_one_line() -> None:
    p = only_problem(
        edit(
            PARALLEL,
            "          machine: other\n",
            "          machine: other\n          input: 'context.['\n",
        )
    )
    assert_problem(p, "FAN.docs", "input", "'context.[' does not compile")


def test_each_key_of_an_input_is_checked() -> None:
    text = edit(
        MACHINE,
        "    machine: other\n",
        "    machine: other\n    input: {good: context.a, bad: 'a ||| b'}\n",
    )
    p = only_problem(text)
    assert str(p) == (
        "fan.yaml: state DELEGATE: field input.bad: 'a ||| b' does not compile: "
        'invalid token: Parse error at column 4, token "|" (PIPE)'
    )


# -- tree_problems ------------------------------------------------------------------------------


def test_a_machine_that_names_no_loaded_type_is_refused() -> None:
    found = list(tree_problems(loaded(PARALLEL, MACHINE), max_depth=5))
    assert found == [
        Problem("machine 'other' is not a loaded definition", "fan", "FAN.docs"),
        Problem("machine 'other' is not a loaded definition", "delegate", "DELEGATE"),
    ]


def test_a_machine_inside_an_inline_body_names_its_path() -> None:
    text = edit(
        PARALLEL,
        "{name: GO, on_success: DONE, on_failure: FAILED}",
        "{name: GO, machine: gone, on_success: DONE, on_failure: FAILED}",
    )
    found = list(tree_problems(loaded(text, OTHER), max_depth=5))
    assert found == [Problem("machine 'gone' is not a loaded definition", "fan", "FAN.tests.GO")]


def test_definitions_that_start_each_other_in_a_cycle_are_refused() -> None:
    a = edit(MACHINE, "type: delegate", "type: a").replace("machine: other", "machine: b")
    b = edit(MACHINE, "type: delegate", "type: b").replace("machine: other", "machine: a")
    found = list(tree_problems(loaded(a, b), max_depth=5))
    cycle = "definitions start each other in a cycle: a -> b -> a"
    assert found == [Problem(cycle, "a"), Problem(cycle, "b")]  # under each: whichever loads


def test_a_definition_that_starts_itself_is_a_cycle() -> None:
    a = edit(MACHINE, "type: delegate", "type: a").replace("machine: other", "machine: a")
    assert [p.message for p in tree_problems(loaded(a), max_depth=5)] == [
        "definitions start each other in a cycle: a -> a"
    ]


def test_children_nested_past_max_depth_are_refused() -> None:
    a = edit(MACHINE, "type: delegate", "type: a").replace("machine: other", "machine: b")
    b = edit(MACHINE, "type: delegate", "type: b")
    definitions = loaded(a, b, OTHER)
    assert list(tree_problems(definitions, max_depth=2)) == []
    assert list(tree_problems(definitions, max_depth=1)) == [
        Problem("children nest 2 deep, past FSM_MAX_CHILD_DEPTH=1", "a")
    ]


def test_inline_bodies_count_toward_the_depth() -> None:
    text = nested("              map: {items: context.xs, max_concurrency: 1, machine: other}\n")
    found = [str(p) for p in tree_problems(loaded(text, OTHER), max_depth=1)]
    assert found == ["fan: children nest 2 deep, past FSM_MAX_CHILD_DEPTH=1"]


# -- children, child_type, inline, at, agent_type_of -------------------------------------------


def test_a_parallel_state_starts_one_child_per_branch() -> None:
    d = load_text(PARALLEL, SOURCE)
    state = d.state("FAN")
    assert [branch for branch, _ in d.children(state)] == ["tests", "docs"]
    assert [d.child_type(state, b, body) for b, body in d.children(state)] == [
        "fan.FAN.tests",
        "other",
    ]


def test_a_map_starts_its_one_body_per_item_typed_by_its_state() -> None:
    d = load_text(MAP, SOURCE)
    ((branch, body),) = d.children(d.state("EACH"))
    assert branch is None
    assert d.child_type(d.state("EACH"), branch, body) == "each.EACH"


def test_a_machine_state_starts_a_machine_of_the_type_it_names() -> None:
    text = edit(MACHINE, "    machine: other\n", "    machine: other\n    input: context.a\n")
    d = load_text(text, SOURCE)
    state = d.state("DELEGATE")
    assert d.children(state) == ((None, Body(machine="other", input="context.a")),)
    assert d.child_type(state, None, d.children(state)[0][1]) == "other"


def test_a_state_without_children_starts_none() -> None:
    d = load_text(OTHER, SOURCE)
    assert d.children(d.state("WORK")) == ()
    assert d.state("WORK").on_parent_cancel is ParentCancel.CANCEL


def test_an_inline_branch_is_a_machine_typed_by_its_place() -> None:
    d = load_text(PARALLEL, SOURCE)
    inner = d.inline("FAN", "tests")
    assert (inner.type, inner.initial_state, inner.agent_type) == ("fan.FAN.tests", "GO", "writer")
    assert [s.name for s in inner.states] == ["GO", "DONE", "FAILED"]
    assert d.inline("FAN", "tests") is inner


def test_an_inline_body_takes_its_state_s_agent_type_then_its_machine_s() -> None:
    d = load_text(edit(MAP, "  - name: EACH\n", "  - name: EACH\n    agent_type: mapper\n"), SOURCE)
    assert d.inline("EACH").agent_type == "mapper"
    assert load_text(MAP, SOURCE).inline("EACH").agent_type == "cto"


def test_at_finds_the_definition_of_a_type_inside_this_one() -> None:
    d = load_text(PARALLEL, SOURCE)
    assert d.at("fan") is d
    assert d.at("fan.FAN.tests") is d.inline("FAN", "tests")
    m = load_text(MAP, SOURCE)
    assert m.at("each.EACH") is m.inline("EACH")


def test_at_walks_down_nested_inline_bodies() -> None:
    inner = (
        "                items: context.xs\n"
        "                max_concurrency: 1\n"
        "                initial_state: W\n"
        "                states:\n"
        "                  - {name: W, on_success: E, on_failure: E}\n"
        "                  - {name: E, terminal: completed}\n"
    )
    d = load_text(nested("              map:\n" + inner), SOURCE)
    deep = d.at("fan.FAN.tests.GO")
    assert deep.type == "fan.FAN.tests.GO"
    assert [s.name for s in deep.states] == ["W", "E"]
    assert deep.agent_type == "writer"  # the branch's, handed down


def test_agent_type_of_a_state_is_its_own_or_its_machine_s() -> None:
    d = load_text(edit(OTHER, "{name: WORK,", "{name: WORK, agent_type: coder,"), SOURCE)
    assert d.agent_type_of(d.state("WORK")) == "coder"
    assert d.agent_type_of(d.state("DONE")) == "cto"
    inner = load_text(PARALLEL, SOURCE).inline("FAN", "tests")
    assert inner.agent_type_of(inner.state("GO")) == "writer"
