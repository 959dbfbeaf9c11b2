"""A list's page: one more item read than shown tells whether a next page follows, and a cursor
a page gave is read back as it was given (a 400 for anything else)."""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import uuid4

import pytest
from fastapi import HTTPException

from fsm_celery.client.machines import encode_cursor
from fsm_celery.http.paging import MachinePage, Page, StepPage, decode_cursor


def test_a_page_shows_its_limit_and_names_the_last_shown_when_more_follow() -> None:
    page = Page(3)
    assert page.asked == 4
    assert page.split([1, 2, 3, 4]) == ([1, 2, 3], 3)
    assert page.split([1, 2, 3]) == ([1, 2, 3], None)
    assert page.answer([1, 2, 3, 4], str, lambda n: n * 10) == {
        "items": ["1", "2", "3"],
        "next": 30,
    }
    assert page.answer([], str, str) == {"items": [], "next": None}


def test_a_cursor_is_read_back_as_it_was_given() -> None:
    cursor = (datetime(2026, 11, 25, 14, 0, tzinfo=UTC), uuid4())
    assert MachinePage(50, encode_cursor(cursor)).cursor == cursor
    assert MachinePage(50).cursor is None
    assert StepPage(100).after == -1


@pytest.mark.parametrize("text", ["nope", "e30", "W10"])
def test_a_cursor_no_page_gave_is_refused(text: str) -> None:
    with pytest.raises(HTTPException) as refused:
        decode_cursor(text)
    assert refused.value.status_code == 400
    assert "is not one a page gave" in refused.value.detail
