"""A tool state's load errors: what only an agent's state has (a prompt, an agent type,
corrections), another kind's fields, and arguments whose templates do not compile, each named
by its field. And a tool state needs no agent: its definition names no agent type for it."""

from __future__ import annotations

import pytest

from fsm_celery.core.kinds import state_kind
from fsm_celery.core.loader import load_text
from fsm_celery.exceptions import DefinitionError

TEMPLATE = """
type: tool_doc
agent_type: cto
initial_state: CALL
states:
  - name: CALL
    tool: {{server: ci, name: run_tests, arguments: {{issue: "{arg}"}}}}
{extra}
    on_success: DONE
    on_failure: DONE
  - name: DONE
    terminal: completed
"""


def load(arg: str = "{{ n }}", extra: str = "") -> None:
    load_text(TEMPLATE.format(arg=arg, extra=extra))


def test_a_tool_state_loads_and_is_of_kind_tool() -> None:
    definition = load_text(TEMPLATE.format(arg="{{ n }}", extra=""))
    assert state_kind(definition.state("CALL")) == "tool"


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ("    prompt: do it", "prompt"),
        ("    agent_type: reviewer", "agent_type"),
        ("    max_corrections: 1", "max_corrections"),
        ("    wait: {event: go}", "wait"),
    ],
)
def test_what_a_tool_state_has_none_of_is_a_load_error_naming_the_field(
    extra: str, field: str
) -> None:
    with pytest.raises(DefinitionError, match=f"field {field}: a tool state has no {field}"):
        load(extra=extra)


def test_an_argument_whose_template_does_not_compile_is_named() -> None:
    with pytest.raises(DefinitionError, match=r"field tool\.arguments\.issue: the template"):
        load(arg="{{ n ")
