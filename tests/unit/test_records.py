"""The machine's fields are the table's: what the client hands back reads them by the columns'
names, and what the HTTP API takes is bounded by the columns that store it."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Column, Table

from fsm_celery.core.messages import INT32_MAX, INT64_MAX
from fsm_celery.http import models
from fsm_celery.records import FAN_OUT_ROW, NODE_ROW, ROW_FIELDS, MachineInfo
from fsm_celery.store.rows import most
from fsm_celery.store.tables import fan_outs, machines, transitions

ASKED_OF_MACHINE = {"queue_position", "key"}  # read for one machine, not its columns


@pytest.mark.parametrize(
    ("names", "table"),
    [
        (set(MachineInfo.__dataclass_fields__) - ASKED_OF_MACHINE, machines),
        (set(ROW_FIELDS), transitions),
        (set(FAN_OUT_ROW), fan_outs),
        (set(NODE_ROW), machines),
    ],
)
def test_what_a_record_reads_of_a_row_are_its_columns(names: set[str], table: Table) -> None:
    assert names <= set(table.c.keys())


@pytest.mark.parametrize(
    ("column", "bound"),
    [
        (machines.c.type, 120),
        (machines.c.agent_type, 10),
        (machines.c.github_issue, INT32_MAX),
        (machines.c.budget_tokens, INT64_MAX),
        (machines.c.depth, 2**15 - 1),
    ],
)
def test_a_columns_bound_is_what_it_holds(column: Column[Any], bound: int) -> None:
    assert most(column) == bound


def test_a_column_without_a_bound_has_none_to_give() -> None:
    with pytest.raises(TypeError, match="no bound"):
        most(machines.c.context)


def test_the_apis_bounds_are_the_columns() -> None:
    assert (models.TYPE_CHARS, models.AGENT_TYPE_CHARS) == (120, 10)
    assert models.STEP_MOST == INT32_MAX
    body = models.StartRequest.model_json_schema()["properties"]
    assert body["github_issue"]["anyOf"][0]["maximum"] == INT32_MAX
