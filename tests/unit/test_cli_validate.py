"""`fsm-celery definitions validate`: what it says of a bad file, and that the shipped
definitions pass (no database or Redis: it reads files only)."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from fsm_celery import cli
from fsm_celery.core.loader import SHIPPED_DEFINITIONS


def test_cli_validate_names_file_state_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "type: bad\nagent_type: x\ninitial_state: A\nstates:\n"
        "  - {name: A, timeout: 0, on_success: B, on_failure: END}\n"
        "  - {name: END, terminal: completed}\n"
    )
    result = CliRunner().invoke(cli.main, ["definitions", "validate", str(bad)])
    assert result.exit_code == 3  # bad configuration
    assert f"{bad}: state A: field timeout: timeout must be positive" in result.output
    assert f"{bad}: state A: field on_success[0]: unknown target state 'B'" in result.output


def test_cli_validate_accepts_the_shipped_definitions() -> None:
    result = CliRunner().invoke(cli.main, ["definitions", "validate", str(SHIPPED_DEFINITIONS)])
    assert result.exit_code == 0, result.output
    assert result.output.count("ok  ") == len(list(SHIPPED_DEFINITIONS.glob("*.yaml")))
