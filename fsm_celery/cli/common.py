"""What the command line's parts share: the client, the options they repeat (--json, --limit,
--reason and --actor, KEY=VALUE fields), JSON in and out, and how a table or a view is shown."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

import click

from fsm_celery.client import Client
from fsm_celery.core.timeline import ACTOR_CHARS
from fsm_celery.terminal import table

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def client() -> Client:
    from fsm_celery.api import default_client

    return default_client()


def json_object(_ctx: click.Context, _param: click.Parameter, value: str) -> dict[str, Any]:
    try:
        data = json.loads(value)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not valid JSON: {exc}") from exc
    except RecursionError:
        raise click.BadParameter("JSON nested too deeply") from None
    if not isinstance(data, dict):
        raise click.BadParameter(f"must be a JSON object, got {type(data).__name__}")
    return data


def fields(_ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]) -> dict[str, Any]:
    """KEY=VALUE, repeated: VALUE as JSON when it is JSON (42, true, "x", [1]), else as text."""
    found: dict[str, Any] = {}
    for pair in values:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE")
        try:
            found[key] = json.loads(value)
        except (json.JSONDecodeError, RecursionError):
            found[key] = value
    return found


def actor(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    if len(value) > ACTOR_CHARS:
        raise click.BadParameter(f"{len(value)} characters long: at most {ACTOR_CHARS}")
    return value


def actor_option() -> Callable[[F], F]:
    return click.option(
        "--actor",
        default=lambda: os.environ.get("USER", "cli"),
        show_default="$USER",
        callback=actor,
    )


def options(*decorators: Callable[[F], F]) -> Callable[[F], F]:
    """Several click decorators as one, in the order they are written above a command."""

    def decorate(command: F) -> F:
        for decorator in reversed(decorators):
            command = decorator(command)
        return command

    return decorate


def audited(why: str) -> Callable[[F], F]:
    """--reason (WHY its help: where the reason is kept) and --actor: who changed something."""
    return options(click.option("--reason", default="", help=why), actor_option())


def json_option(about: str | None = None) -> Callable[[F], F]:
    return click.option("--json", "as_json", is_flag=True, help=about)


def bounded(
    name: str, least: int, most: int | None, default: int, about: str | None = None
) -> Callable[[F], F]:
    """An integer option within [least, most], its default shown."""
    return click.option(
        name, type=click.IntRange(least, most), default=default, show_default=True, help=about
    )


def limit_option(default: int = 50, most: int | None = 10_000) -> Callable[[F], F]:
    return bounded("--limit", 1, most, default)


def operator() -> str:
    """The CLI's identity at a gate: the OS user running it (not $USER, which anyone sets)."""
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name[:ACTOR_CHARS]
    except KeyError:  # a uid with no passwd entry (a container's)
        return f"uid {os.geteuid()}"


@contextmanager
def refused(as_error: type[click.UsageError] = click.UsageError) -> Iterator[None]:
    """A ValueError raised inside, from checking what was given, as click's usage error."""
    try:
        yield
    except ValueError as exc:
        raise as_error(str(exc)) from exc


def echo_lines(lines: list[str]) -> None:
    for line in lines:
        click.echo(line)


def echo_json(data: Any) -> None:
    """Data as JSON: every control and non-ASCII character escaped (\\u001b), so that what an
    agent wrote cannot reach the terminal as an escape sequence."""
    click.echo(json.dumps(data, indent=2, default=str, ensure_ascii=True))


def show(
    found: T,
    as_json: bool,
    lines: Callable[[T], list[str]],
    data: Callable[[T], Any] = lambda found: found,
) -> None:
    """What a command found: as JSON with --json, else as the lines of its view."""
    if as_json:
        echo_json(data(found))
    else:
        echo_lines(lines(found))


def echo_table(header: Sequence[str], rows: Sequence[Sequence[Any]], empty: str) -> None:
    """A table, or one line saying there is nothing in it."""
    echo_lines(table(header, rows) if rows else [empty])


if TYPE_CHECKING:  # generic from Click 8.2 on (the pyproject allows 8.1)
    _ParamType: TypeAlias = click.ParamType[float, Any]
else:
    _ParamType = click.ParamType


class Duration(_ParamType):
    """A duration option: a number in the option's unit, or a duration as definitions write
    it (30s, 10m, 4h, 2d, 1h30m, PT5M); its value in that unit, within [0, most]."""

    name = "duration"

    def __init__(self, unit: str, seconds: float, most: float, *, positive: bool = False) -> None:
        self.unit, self.seconds, self.most, self.positive = unit, seconds, most, positive

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        from fsm_celery.core.duration import parse_duration

        if isinstance(value, float):  # a default
            return value
        try:
            number = float(value)
        except ValueError:
            try:
                number = parse_duration(str(value)).total_seconds() / self.seconds
            except ValueError as exc:
                self.fail(f"{exc} (a number is {self.unit})", param, ctx)
        if not 0 <= number <= self.most or (self.positive and number == 0):
            least = "more than 0" if self.positive else "at least 0"
            self.fail(f"{value!r} is not {least} and at most {self.most:g} {self.unit}", param, ctx)
        return number
