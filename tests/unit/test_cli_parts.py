"""The command line's parts (fsm_celery/cli/) each bring their own commands to the root group:
no two parts name the same command (the later would replace the earlier without a word)."""

from __future__ import annotations

from collections import Counter

from fsm_celery.cli import PARTS, main


def test_every_part_registers_its_commands_and_no_name_is_taken_twice() -> None:
    names = Counter(command.name for part in PARTS for command in part.COMMANDS)
    assert [name for name, count in names.items() if count > 1] == []
    assert set(names) == set(main.commands)
