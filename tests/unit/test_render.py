"""Prompt rendering: plain prompts skip Jinja and come out exactly as Jinja would give them; every
error of a render, and every render that would grow without bound, is a PromptError."""

from __future__ import annotations

import re

import pytest

from fsm_celery.core.prompt import PromptError, compiled, render

LIMIT = 100_000


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
    assert render(prompt, context, LIMIT) == compiled(prompt).render(**context)


def test_a_context_key_named_self_does_not_break_rendering() -> None:
    # Jinja reserves the name `self` (the template); a context holding it renders all the same.
    assert render("Fix #{{ n }}", {"self": 1, "n": 2}, LIMIT) == "Fix #2"


@pytest.mark.parametrize(
    ("prompt", "context", "error"),
    [
        ("{{ 1 / zero }}", {"zero": 0}, "ZeroDivisionError"),
        ("{{ name + 1 }}", {"name": "x"}, "TypeError"),
        ("{{ 'x' * 10**8 }}", {}, "a repetition would build 100,000,000 items"),
        ("{{ 'x' * n }}", {"n": 10**8}, "a repetition would build 100,000,000 items"),
        ("{{ [0] * n }}", {"n": 10**7}, "a repetition would build 10,000,000 items"),
        ("{{ 10 ** n }}", {"n": 10**6}, "10 ** 1000000 is too large"),
        ("{% for i in range(10**9) %}x{% endfor %}", {}, "OverflowError"),
    ],
    ids=[
        "zero-division",
        "type-error",
        "huge-repeat-in-the-template",
        "huge-repeat-from-the-context",
        "huge-list",
        "huge-power",
        "sandbox-overflow",
    ],
)
def test_a_prompt_that_cannot_render_raises_prompt_error(
    prompt: str, context: dict[str, object], error: str
) -> None:
    with pytest.raises(PromptError, match=re.escape(error)):
        render(prompt, context, LIMIT)


def test_a_rendered_prompt_over_the_limit_is_refused() -> None:
    prompt = "{% for i in range(1000) %}{{ line }}{% endfor %}"
    with pytest.raises(PromptError, match="over 100000 bytes"):
        render(prompt, {"line": "y" * 200}, LIMIT)


def test_the_sandbox_refuses_python_internals() -> None:
    with pytest.raises(PromptError, match="unsafe"):
        render("[{{ x.__class__.__mro__ }}]", {"x": 1}, LIMIT)
