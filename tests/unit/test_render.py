"""Prompt rendering: plain prompts skip Jinja and come out exactly as Jinja would give them."""

from __future__ import annotations

import pytest

from fsm_celery.engine import _render, _template


@pytest.mark.parametrize(
    "prompt",
    [
        "",
        "Run the tests.",
        "two\nlines",
        "ends in a newline\n",
        "Fix #{{ githubIssue }}",
        "{# note #}",
    ],
)
def test_a_prompt_renders_as_jinja_renders_it(prompt: str) -> None:
    context = {"githubIssue": 740}
    assert _render(prompt, context) == _template(prompt).render(**context)
