"""The command line's duration options take the units definitions take, besides numbers."""

from __future__ import annotations

import click
import pytest

from fsm_celery.cli import main
from fsm_celery.cli.agents import _mock_script


def parsed(*args: str) -> dict[str, object]:
    """The parameters of a subcommand, parsed and converted, not run."""
    group = main
    ctx = group.make_context("fsm-celery", list(args))
    words = list(args)
    command: click.Command = group
    while isinstance(command, click.Group):
        name, found, words = command.resolve_command(ctx, words)
        assert found is not None, name
        command = found
        ctx = command.make_context(name or "", words, parent=ctx)
    return ctx.params


@pytest.mark.parametrize(("given", "days"), [("90", 90.0), ("90d", 90.0), ("12h", 0.5)])
def test_history_archive_older_than_takes_days_or_units(given: str, days: float) -> None:
    assert parsed("history", "archive", "--older-than", given, "--dry-run")["days"] == days


@pytest.mark.parametrize(("given", "seconds"), [("2", 2.0), ("2s", 2.0), ("1m", 60.0)])
def test_agent_think_takes_seconds_or_units(given: str, seconds: float) -> None:
    assert parsed("agent", "--mock", "--think", given)["think"] == seconds


def test_a_mock_agents_slow_state_takes_units() -> None:
    assert _mock_script(0, (), ("WRITE_CODE=1m",), (), 0.0).slow == {"WRITE_CODE": 60.0}


@pytest.mark.parametrize("given", ["0", "0s", "an hour", "-1d", "nan", "200y"])
def test_a_duration_option_out_of_range_or_unreadable_is_refused(given: str) -> None:
    with pytest.raises(click.BadParameter, match="days"):
        parsed("history", "archive", "--older-than", given)
