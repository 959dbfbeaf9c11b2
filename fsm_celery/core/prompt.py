"""Prompt templates: Jinja2 in a sandbox that also bounds what a template can allocate. Pure.

A prompt is written by the definition's author, but the context it is rendered with comes from
agents' outputs: `{{ 'x' * n }}` with an `n` an agent chose, or a template that divides by a
value the agent sent as 0, must fail that one machine's attempt, never the process rendering it.
So every error of a render is a `PromptError`, and the arithmetic that can allocate without
limit (`*` and `**` on long operands) is checked before it runs; what a template writes is cut
off once it passes the limit.

A variable the context lacks is an error, not an empty string: an agent told "research: " has
nothing to work on and fails its attempt, again and again. Testing for it (`{% if x %}`,
`x is defined`, `x | default(...)`) is how a template says a key is optional, and stays allowed.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Mapping
from functools import lru_cache
from typing import Any

import jinja2
from jinja2 import meta, nodes
from jinja2.runtime import Context
from jinja2.sandbox import SandboxedEnvironment

MAX_ITEMS = 1_000_000  # the longest string or list one `*` may build
MAX_POWER_BITS = 4096  # the largest number one `**` may build


class PromptError(Exception):
    """A prompt could not be rendered; the message says why."""


class BoundedSandbox(SandboxedEnvironment):
    """Jinja's sandbox, with `*` and `**` refused when their result would be too large."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context: Context, op: str, left: Any, right: Any) -> Any:
        if op == "*":
            _check_repeat(left, right)
            _check_repeat(right, left)
            return operator.mul(left, right)
        _check_power(left, right)
        return operator.pow(left, right)


def _check_repeat(sequence: Any, times: Any) -> None:
    repeats = isinstance(sequence, str | list | tuple) and isinstance(times, int)
    if repeats and len(sequence) * times > MAX_ITEMS:
        raise PromptError(f"a repetition would build {len(sequence) * times:,} items")


def _check_power(base: Any, exponent: Any) -> None:
    whole = isinstance(base, int) and isinstance(exponent, int) and abs(base) > 1
    if whole and base.bit_length() * exponent > MAX_POWER_BITS:
        raise PromptError(f"{base} ** {exponent} is too large")


class StrictContext(jinja2.Undefined):
    """Printing, iterating or reading into an undefined key fails the render (as jinja2's
    StrictUndefined); a test of it is false: `{% if specPath %}` handles an optional key."""

    __slots__ = ()

    def __str__(self) -> str:
        return self._fail_with_undefined_error()

    def __iter__(self) -> Iterator[Any]:
        return self._fail_with_undefined_error()

    def __len__(self) -> int:
        return self._fail_with_undefined_error()


TEMPLATES = BoundedSandbox(autoescape=False, undefined=StrictContext)
GUARDING_TESTS = frozenset({"defined", "undefined", "none"})
GUARDING_FILTERS = frozenset({"default", "d"})


@lru_cache(maxsize=4096)
def compiled(source: str) -> jinja2.Template:
    """The compiled template (compiling costs far more than rendering)."""
    return TEMPLATES.from_string(source)


def render(source: str, context: Mapping[str, Any], max_bytes: int) -> str:
    """The prompt rendered with the context, or PromptError naming what went wrong."""
    if "{" not in source and not source.endswith("\n"):
        return source  # Jinja would give it back as it is (it drops one trailing newline)
    try:
        # The context is one mapping, not keyword arguments: a key such as "self" is a value
        # like any other.
        return _bounded(compiled(source).generate(dict(context)), max_bytes)
    except PromptError:
        raise
    except jinja2.UndefinedError as exc:
        raise PromptError(str(exc)) from exc
    except Exception as exc:  # anything a template can raise fails the attempt, nothing more
        raise PromptError(f"{type(exc).__name__}: {exc}") from exc


def _bounded(chunks: Any, max_bytes: int) -> str:
    parts: list[str] = []
    size = 0
    for chunk in chunks:
        size += len(chunk.encode("utf-8", "surrogatepass"))
        if size > max_bytes:
            raise PromptError(f"the rendered prompt is over {max_bytes} bytes")
        parts.append(chunk)
    return "".join(parts)


def variables(source: str) -> tuple[frozenset[str], frozenset[str]]:
    """The context keys a template reads: (those it uses, those it tests for before use).

    A key tested anywhere (an `if`, `is defined`, `| default`) counts as optional throughout:
    the check that uses this may miss a bug, never report one that is not.
    """
    tree = TEMPLATES.parse(source)
    used = frozenset(meta.find_undeclared_variables(tree))
    tested: set[str] = set()
    for branch in tree.find_all(nodes.If):
        tested |= _names(branch.test)
    for choice in tree.find_all(nodes.CondExpr):
        tested |= _names(choice.test)
    for check in tree.find_all(nodes.Test):
        tested |= _names(check.node) if check.name in GUARDING_TESTS else set()
    for fallback in tree.find_all(nodes.Filter):
        tested |= _names(fallback.node) if fallback.name in GUARDING_FILTERS else set()
    return used - tested, used & frozenset(tested)


def _names(node: nodes.Node | None) -> set[str]:
    if node is None:
        return set()
    found = {n.name for n in node.find_all(nodes.Name) if n.ctx == "load"}
    return found | ({node.name} if isinstance(node, nodes.Name) else set())
