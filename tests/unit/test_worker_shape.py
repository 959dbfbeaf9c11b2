"""Which worker pools the engine's group commit cannot combine tasks in (worker/shape.py)."""

from __future__ import annotations

import pytest

from fsm_celery.worker.shape import slow_shape


@pytest.mark.parametrize(
    ("pool", "concurrency"),
    [("celery.concurrency.thread:TaskPool", 16), ("threads", 4), ("threads", 64)],
)
def test_threads_enough_to_combine_are_not_slow(pool: str, concurrency: int) -> None:
    assert slow_shape(pool, concurrency) is None


@pytest.mark.parametrize(
    ("pool", "concurrency", "named"),
    [
        ("celery.concurrency.thread:TaskPool", 2, "-P threads -c 2"),
        ("threads", 1, "-P threads -c 1"),
        ("celery.concurrency.prefork:TaskPool", 16, "-P prefork -c 16"),
        ("celery.concurrency.solo:TaskPool", 1, "-P solo -c 1"),
    ],
)
def test_a_pool_that_runs_few_tasks_at_once_is_named_with_the_advice(
    pool: str, concurrency: int, named: str
) -> None:
    said = slow_shape(pool, concurrency)
    assert said is not None and said.startswith(named), said
    assert said.endswith(
        "run -P threads -c 16 (celeryconfig.py's default), one worker process per core"
    )
