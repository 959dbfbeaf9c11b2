"""The lists a page at a time: how many items, where the page starts (a cursor a page gave, or a
step), and the answer's `next`. One more item is asked for than is shown: it tells whether a
next page follows. The list routes take their page as a dependency (`MachinePage`, `StepPage`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from fastapi import HTTPException, Query

from fsm_celery.client.machines import decode_cursor as client_cursor
from fsm_celery.client.machines import encode_cursor
from fsm_celery.http.models import STEP_MOST
from fsm_celery.records import MachineInfo, TransitionRecord
from fsm_celery.store.reads import Cursor

T = TypeVar("T")
MOST = 500  # items on one page at the most
CURSOR_CHARS = 200


@dataclass(frozen=True)
class Page:
    """How many items a list shows; `asked` is what to read (one more)."""

    limit: int

    @property
    def asked(self) -> int:
        return self.limit + 1

    def split(self, found: Sequence[T]) -> tuple[Sequence[T], T | None]:
        """The items shown, and the last of them when a next page follows (else None)."""
        shown = found[: self.limit]
        return shown, (shown[-1] if len(found) > self.limit else None)

    def answer(
        self, found: Sequence[T], item: Callable[[T], Any], next_of: Callable[[T], Any]
    ) -> dict[str, Any]:
        """{"items": the items shown, "next": where the next page starts, or None}."""
        shown, last = self.split(found)
        return {"items": [item(x) for x in shown], "next": None if last is None else next_of(last)}


@dataclass(frozen=True)
class MachinePage(Page):
    """A page of machines, newest first, from the cursor a previous page gave."""

    given: str | None = None

    @property
    def cursor(self) -> Cursor | None:
        """The cursor given, read when the route asks (400 when it is not one a page gave)."""
        return decode_cursor(self.given)

    def machines(self, found: Sequence[MachineInfo]) -> dict[str, Any]:
        """The page of the machines `found`, and the next page's cursor."""
        return self.answer(found, MachineInfo.to_dict, lambda m: encode_cursor(m.cursor))


@dataclass(frozen=True)
class StepPage(Page):
    """A page of a machine's steps, those after step `after` (-1: from the start)."""

    after: int = -1

    def steps(self, found: Sequence[TransitionRecord]) -> dict[str, Any]:
        """The page of the steps `found`; `next` is the `after` of the next page."""
        return self.answer(found, TransitionRecord.to_dict, lambda h: h.attempt)


def machine_page(
    limit: Annotated[int, Query(ge=1, le=MOST)] = 50,
    cursor: Annotated[str | None, Query(max_length=CURSOR_CHARS)] = None,
) -> MachinePage:
    """The `limit` and `cursor` of a list of machines."""
    return MachinePage(limit, cursor)


def step_page(
    limit: Annotated[int, Query(ge=1, le=MOST)] = 100,
    after: Annotated[int, Query(ge=-1, le=STEP_MOST)] = -1,
) -> StepPage:
    """The `limit` and `after` of a list of steps."""
    return StepPage(limit, after)


def decode_cursor(text: str | None) -> Cursor | None:
    """The cursor a previous page gave (400 when it is not one)."""
    if not text:
        return None
    try:
        return client_cursor(text)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from exc
