"""What the engine's use cases are built on: the runtime they run in, and the Entry that enters
the states they move machines to (engine/__init__.py builds each with the same parts)."""

from __future__ import annotations

from fsm_celery.engine.entry import Entry
from fsm_celery.engine.runtime import Runtime


class UseCase:
    """A use case on the runtime alone: it reads, or starts what others enter."""

    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime


class MovingUseCase(UseCase):
    """A use case that moves machines, and enters the states they arrive in."""

    def __init__(self, runtime: Runtime, entry: Entry) -> None:
        super().__init__(runtime)
        self._entry = entry
