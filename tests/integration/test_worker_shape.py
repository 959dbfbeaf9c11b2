"""A worker whose pool cannot combine its tasks' transactions (a Celery user's habit: `-c 2`,
one per core) says so when it starts, and `fsm-celery doctor` names it, with the advice; it
still works, so doctor does not fail for it (docs/performance.md, "Worker shapes")."""

from __future__ import annotations

import re
from collections.abc import Callable

from tests.support.doctor import by_check, run_doctor
from tests.support.processes import FsmEnv

ADVICE = "run -P threads -c 16 (celeryconfig.py's default), one worker process per core"


def _workers_line(env: FsmEnv) -> str:
    done = run_doctor(env)
    return by_check(done.stdout)["workers"]


def test_a_worker_of_two_threads_says_it_is_slow_and_doctor_names_it(
    env_factory: Callable[..., FsmEnv],
) -> None:
    env = env_factory("shape", transition_mode="celery")
    slow = env.start_worker(beat=False, concurrency=2)
    slow.wait_for_log("-P threads -c 2 combines few transactions")
    assert ADVICE in slow.log.read_text()
    ours = re.compile(rf"{env.name}-\w+@[^:]+: -P threads -c (\d+) combines few transactions")
    line = _workers_line(env)  # other tests' workers may answer too, on the same broker
    assert line.startswith("✔ workers: "), line
    assert ours.findall(line) == ["2"], line
    found = ours.search(line)
    assert found is not None and ADVICE in line[found.end() :], line
    env.stop_all()
    env.procs.clear()
    fine = env.start_worker(beat=False, concurrency=16)
    assert "combines few transactions" not in fine.log.read_text()
    line = _workers_line(env)
    assert line.startswith("✔ workers: ") and not ours.findall(line), line
