"""A definition's context_schema (fsm_celery.core.context): the schema checked when it loads, a
starting context checked against it in one line naming the field, and the static check of the
keys its prompts use; and prompts rendered strictly (fsm_celery.core.prompt)."""

from __future__ import annotations

from typing import Any

import pytest

from fsm_celery.core.context import context_problem, schema_problem
from fsm_celery.core.loader import SHIPPED_DEFINITIONS, load_file, load_text, parse_definition
from fsm_celery.core.prompt import PromptError, render, variables
from fsm_celery.exceptions import DefinitionError

RESEARCH = load_file(SHIPPED_DEFINITIONS / "research_pipeline.yaml")
BUILD = load_file(SHIPPED_DEFINITIONS / "cto_build_project.yaml")
LIMIT = 10_000


def _definition(schema: Any = None, **more: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "type": "ctx_test",
        "agent_type": "tester",
        "initial_state": "FIRST",
        "states": [
            {
                "name": "FIRST",
                "prompt": "Research {{ topic }}.",
                "required_output": ["findings"],
                "on_success": "SECOND",
                "on_failure": "SECOND",
            },
            {
                "name": "SECOND",
                "prompt": "Sum up {{ topic }}.",
                "on_success": "DONE",
                "on_failure": "FAILED",
            },
            {"name": "DONE", "terminal": "completed"},
            {"name": "FAILED", "terminal": "failed"},
        ],
        **more,
    }
    if schema is not None:
        data["context_schema"] = schema
    return data


def _problems(data: dict[str, Any]) -> list[str]:
    with pytest.raises(DefinitionError) as caught:
        parse_definition(data, "ctx.yaml")
    return [str(p) for p in caught.value.problems]


TOPIC = {"type": "object", "required": ["topic"], "properties": {"topic": {"type": "string"}}}


# ---- the schema, at load time -----------------------------------------------------------------


def test_every_shipped_definition_declares_its_context_schema() -> None:
    for path in sorted(SHIPPED_DEFINITIONS.glob("*.yaml")):
        definition = load_file(path)
        assert definition.context_schema is not None, path.name
        assert schema_problem(definition.context_schema) is None


def test_a_schema_that_is_not_json_schema_is_refused_naming_where() -> None:
    [problem] = _problems(_definition({"type": "object", "required": "topic"}))
    where = "ctx.yaml: field context_schema: not a valid JSON Schema at /required"
    assert problem.startswith(where)


def test_a_schema_for_something_other_than_an_object_is_refused() -> None:
    [problem] = _problems(_definition({"type": "string"}))
    assert "the type must be object, not 'string'" in problem


def test_a_schema_that_would_fetch_a_remote_reference_is_refused() -> None:
    schema = {"type": "object", "properties": {"topic": {"$ref": "https://example.test/s"}}}
    [problem] = _problems(_definition(schema))
    assert "'https://example.test/s' is not a reference within the schema" in problem


def test_a_reference_to_nothing_in_the_schema_is_refused() -> None:
    schema = {"type": "object", "properties": {"topic": {"$ref": "#/$defs/text"}}}
    [problem] = _problems(_definition(schema))
    assert "the reference '#/$defs/text' points at nothing in the schema" in problem


@pytest.mark.parametrize("dialect", [{"a": 1}, "https://example.test/my-dialect"])
def test_an_unknown_dialect_is_refused(dialect: Any) -> None:
    [problem] = _problems(_definition({"$schema": dialect, "type": "object"}))
    assert "is not a JSON Schema dialect" in problem


def test_an_older_dialect_is_taken_with_its_own_keywords() -> None:
    schema = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "required": ["topic"],
        "properties": {"topic": {"$ref": "#/definitions/text"}},
        "definitions": {"text": {"type": "string"}},
    }
    definition = parse_definition(_definition(schema))
    assert definition.context_schema is not None
    assert context_problem(definition.context_schema, {"topic": 1}) == (
        "at /topic: 1 is not of type 'string'"
    )


def test_a_reference_within_the_schema_is_taken_and_checked() -> None:
    schema = {
        "type": "object",
        "required": ["topic"],
        "properties": {"topic": {"$ref": "#/$defs/text"}},
        "$defs": {"text": {"type": "string", "minLength": 3}},
    }
    definition = parse_definition(_definition(schema))
    assert definition.context_schema is not None
    assert context_problem(definition.context_schema, {"topic": "ok!"}) is None
    assert context_problem(definition.context_schema, {"topic": "no"}) == (
        "at /topic: 'no' is too short"
    )


def test_the_schema_is_part_of_the_definitions_content() -> None:
    plain = parse_definition(_definition(TOPIC))
    stricter = parse_definition(
        _definition({**TOPIC, "properties": {"topic": {"type": "string", "minLength": 1}}})
    )
    assert plain.digest() != stricter.digest()  # a changed schema is a new version
    assert parse_definition(plain.to_json()) == plain


def test_a_schedule_whose_context_does_not_match_the_schema_is_refused_at_load() -> None:
    schedules = [{"cron": "*/15 * * * *"}, {"name": "b", "cron": "0 * * * *", "context": {}}]
    problems = _problems(_definition(TOPIC, schedules=schedules))
    assert problems == [
        "ctx.yaml: field schedules[0].context: does not match the context_schema: "
        "'topic' is a required property",
        "ctx.yaml: field schedules[1].context: does not match the context_schema: "
        "'topic' is a required property",
    ]


def test_a_schedule_whose_context_matches_loads() -> None:
    schedules = [{"cron": "*/15 * * * *", "context": {"topic": "uptime"}}]
    assert parse_definition(_definition(TOPIC, schedules=schedules)).schedules


def test_a_schema_in_yaml_loads() -> None:
    text = """
type: y
agent_type: tester
initial_state: A
context_schema:
  type: object
  required: [topic]
states:
  - {name: A, prompt: "On {{ topic }}", on_success: B, on_failure: B}
  - {name: B, terminal: completed}
"""
    assert load_text(text).context_schema == {"type": "object", "required": ["topic"]}


# ---- a starting context -----------------------------------------------------------------------


def test_a_missing_key_is_named() -> None:
    assert RESEARCH.context_schema is not None
    assert context_problem(RESEARCH.context_schema, {"topic": "caching"}) == (
        "'taskState' is a required property"
    )


def test_a_missing_nested_key_is_named_with_the_pointer_to_its_object() -> None:
    assert RESEARCH.context_schema is not None
    problem = context_problem(RESEARCH.context_schema, {"taskState": {"topic": "caching"}})
    assert problem == "at /taskState: 'query' is a required property"


def test_a_value_of_the_wrong_type_is_named_with_its_pointer() -> None:
    assert BUILD.context_schema is not None
    problem = context_problem(BUILD.context_schema, {"projectName": "sla", "githubIssue": "12"})
    assert problem == "at /githubIssue: '12' is not of type 'integer'"


def test_a_refusal_is_one_bounded_line_whatever_the_value() -> None:
    assert BUILD.context_schema is not None
    value = {"line\n" * 10_000: 1}
    problem = context_problem(BUILD.context_schema, {"projectName": value, "githubIssue": 1})
    assert problem is not None and "\n" not in problem and len(problem) < 250
    assert problem.startswith("at /projectName: ")


def test_the_contexts_the_readme_and_the_demo_start_with_match() -> None:
    assert BUILD.context_schema is not None
    assert context_problem(BUILD.context_schema, {"projectName": "sla", "githubIssue": 726}) is None


# ---- prompts, rendered strictly ---------------------------------------------------------------


def test_a_variable_the_context_lacks_fails_the_render_naming_it() -> None:
    with pytest.raises(PromptError, match=r"^'topic' is undefined$"):
        render("Research: {{ topic }}", {"query": "caching"}, LIMIT)


def test_a_missing_key_of_an_object_fails_the_render() -> None:
    with pytest.raises(PromptError, match="has no attribute 'query'"):
        render("Research: {{ taskState.query }}", {"taskState": {}}, LIMIT)


def test_iterating_what_is_not_there_fails_the_render() -> None:
    with pytest.raises(PromptError, match="'files' is undefined"):
        render("{% for f in files %}{{ f }}{% endfor %}", {}, LIMIT)


@pytest.mark.parametrize(
    "template",
    [
        "a{% if specPath %} at {{ specPath }}{% endif %}",
        "a{% if specPath is defined %} at {{ specPath }}{% endif %}",
        "a{{ specPath | default('') }}",
        "a{{ ' at ' ~ specPath if specPath else '' }}",
    ],
)
def test_a_key_tested_before_use_is_optional(template: str) -> None:
    assert render(template, {}, LIMIT) == "a"
    assert render(template, {"specPath": "s"}, LIMIT).endswith("s")


def test_variables_tells_keys_used_from_keys_tested() -> None:
    used, tested = variables(
        "{{ a }} {{ b.c }} {% if d %}{{ d }}{% endif %} {{ e | default(1) }} {% set f = 1 %}{{ f }}"
    )
    assert (used, tested) == ({"a", "b"}, {"d", "e"})


# ---- the static check of the keys prompts use -------------------------------------------------


def test_a_prompt_using_a_key_the_schema_does_not_require_is_a_problem() -> None:
    problems = _problems(_definition({"type": "object", "properties": {"topic": {}}}))
    assert [p.split(": the prompt uses ")[0] for p in problems] == [
        "ctx.yaml: state FIRST: field prompt",
        "ctx.yaml: state SECOND: field prompt",
    ]
    assert problems[0].startswith("ctx.yaml: state FIRST: field prompt: the prompt uses topic,")


def test_a_key_given_only_by_a_success_is_missing_on_the_failure_edge() -> None:
    data = _definition(TOPIC)
    data["states"][1]["prompt"] = "Sum up {{ findings }}."  # FIRST's failure leads here too
    [problem] = _problems(data)
    assert problem.startswith("ctx.yaml: state SECOND: field prompt: the prompt uses findings,")


def test_a_key_every_way_in_provides_is_no_problem() -> None:
    data = _definition(TOPIC)
    data["states"][0]["on_failure"] = "FAILED"
    data["states"][1]["prompt"] = "Sum up {{ findings }} on {{ topic }} ({{ retryCount }})."
    assert parse_definition(data).state("SECOND").prompt


def test_without_a_schema_the_prompts_keys_are_not_checked() -> None:
    data = _definition()
    data["states"][1]["prompt"] = "Sum up {{ findings }}."
    assert parse_definition(data).context_schema is None
