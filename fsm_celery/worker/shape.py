"""Whether a worker's pool lets the engine's group commit work (worker/combine.py): the tasks
that run at once in one process share a transaction, so a process needs threads to have tasks
to combine. Measured (docs/performance.md, "Worker shapes"): one worker `-P threads -c 2`
moved 0.71 times the transitions of one `-P threads -c 16`, at 1.4 times the worker's CPU per
transition; `-P prefork -c 2` (a process per core, one task at a time each) as little."""

from __future__ import annotations

FEWEST_THREADS = 4  # below it, too few tasks run at once to combine
ADVICE = "run -P threads -c 16 (celeryconfig.py's default), one worker process per core"


def slow_shape(pool: str, concurrency: int) -> str | None:
    """What is slow about a worker of this pool (its class path or name) and concurrency, or
    None when its threads can combine tasks."""
    threads = "thread" in pool.lower()
    if threads and concurrency >= FEWEST_THREADS:
        return None
    name = _name(pool)
    return (
        f"-P {name} -c {concurrency} combines few transactions (a process runs "
        f"{'one task' if not threads else f'{concurrency} tasks'} at a time): measured at 0.71 "
        f"times the transitions of -P threads -c 16; {ADVICE}"
    )


def _name(pool: str) -> str:
    """celery.concurrency.thread:TaskPool -> threads; prefork, solo, ... as given."""
    lowered = pool.lower()
    for known, name in (("thread", "threads"), ("prefork", "prefork"), ("solo", "solo")):
        if known in lowered:
            return name
    return pool.rsplit(".", 1)[-1].split(":", 1)[0]
