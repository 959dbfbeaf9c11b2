"""Tool states: a state whose work is one call of a tool of an MCP server, made by a worker
(fsm_celery.worker, through fsm_celery.mcp.caller). Pure: what a definition says of the call,
its arguments rendered from the machine's context, and what the tool's result becomes.

The arguments are the definition's, with every string a template (core/prompt.py's sandbox):
a string that is one expression and nothing else (`"{{ issue.number }}"`) gives the value as it
is (a number stays a number, a list a list); any other string is rendered as text. Lists and
objects are rendered item by item; numbers, booleans and null are kept.

A tool's result becomes the attempt's output: its structured content when it gives one, else
its text parsed as a JSON object when it is one, else `{"text": ...}` (its text parts joined).
A result the tool marks as an error is the attempt's failure, with its text as the error.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jinja2 import Undefined
from pydantic import BaseModel, ConfigDict, Field

from fsm_celery.core.prompt import TEMPLATES, PromptError, render

NAME = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$"  # a server's name in FSM_MCP_SERVERS
TOOL_NAME = r"^[A-Za-z0-9_][A-Za-z0-9_./-]{0,127}$"  # MCP's tool names
ERROR_CHARS = 2000  # of a failed call's error, as the history keeps it
_ONE_EXPRESSION = re.compile(r"^\{\{(.*)\}\}$", re.DOTALL)


class ToolCall(BaseModel):
    """A tool state's call: which server (a name in FSM_MCP_SERVERS), which tool, and its
    arguments (templates over the machine's context)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    server: str = Field(pattern=NAME)
    name: str = Field(pattern=TOOL_NAME)
    arguments: dict[str, Any] = Field(default_factory=dict)


@dataclass(frozen=True)
class Outcome:
    """What a call came to: the attempt's output, or its error (the call failed, the tool
    said it failed, or its result broke the tool's own output schema)."""

    output: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def success(self) -> bool:
        return self.error is None


def arguments(call: ToolCall, context: Mapping[str, Any], max_bytes: int) -> dict[str, Any]:
    """The call's arguments rendered with the context; PromptError naming the argument that
    could not be, or when they are over max_bytes as JSON."""
    given = call.arguments.items()
    rendered = {key: _value(value, context, max_bytes, key) for key, value in given}
    size = len(json.dumps(rendered, default=str).encode())
    if size > max_bytes:
        raise PromptError(f"the tool's arguments are {size} bytes, over {max_bytes}")
    return rendered


def _value(value: Any, context: Mapping[str, Any], max_bytes: int, where: str) -> Any:
    if isinstance(value, str):
        whole = _ONE_EXPRESSION.match(value.strip())
        if whole is not None and "{{" not in whole.group(1) and "{%" not in value:
            return _expression(whole.group(1), context, where)
        try:
            return render(value, context, max_bytes)
        except PromptError as exc:
            raise PromptError(f"argument {where}: {exc}") from exc
    if isinstance(value, Mapping):
        return {k: _value(v, context, max_bytes, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [_value(v, context, max_bytes, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def _expression(source: str, context: Mapping[str, Any], where: str) -> Any:
    """One expression's value, as it is (`{{ n }}` gives the number n)."""
    try:
        value = TEMPLATES.compile_expression(source, undefined_to_none=False)(dict(context))
    except Exception as exc:  # anything an expression can raise fails the attempt only
        raise PromptError(f"argument {where}: {type(exc).__name__}: {exc}") from exc
    if isinstance(value, Undefined):
        raise PromptError(f"argument {where}: {source.strip()!r} is undefined")
    return _plain(value)


def _plain(value: Any) -> Any:
    """A value the JSON of a tool call carries (a tuple is a list; anything else, its str)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return str(value)


def outcome(
    structured: Mapping[str, Any] | None,
    texts: Sequence[str],
    is_error: bool,
) -> Outcome:
    """The attempt's output (or error) from a tool's result (see the module's docstring)."""
    text = "\n".join(texts)
    if is_error:
        error = _cut(f"the tool failed: {text or 'no message'}")
        return Outcome(error=error)
    if structured is not None:
        return Outcome(output=dict(structured))
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        return Outcome(output=parsed)
    return Outcome(output={"text": text})


def failed(error: str) -> Outcome:
    """A call that did not come to a result (the server away, the tool unknown, a timeout)."""
    return Outcome(error=_cut(error))


def actor(call: ToolCall) -> str:
    """Who acted, as the history names it: `mcp:server/tool` (at most 100 characters)."""
    return f"mcp:{call.server}/{call.name}"[:100]


def _cut(text: str) -> str:
    return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 1] + "…"
