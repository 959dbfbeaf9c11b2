"""A mock agent that acks at once, in batches: reads up to 500 tasks per XREADGROUP and answers
them with one pipeline. Run by the benchmarks so that the agent is not what they measure.

    python bench/fast_agent.py AGENT_ID [RATE]

With FAST_AGENT_TASKS set to an agent type, it reads that type's stream instead of its own (the
tasks of machines no agent is assigned to), and answers on its own ack stream. RATE (acks per
second) paces it, for latency at a chosen load: every millisecond it sends, in one
pipeline, the acks due by then. With FAST_AGENT_LOG set, it writes a line per task received (T)
and per ack sent (A), `T|A machine attempt milliseconds`, both times taken from Redis's clock
(the stream entry ids of the task and of the ack), so the latency benchmark pairs an ack with the
next task of its machine on one clock, however long that task then waited here.

With FAST_AGENT_ONE_AT_A_TIME=1 it is the agent a team writes first with redis-py instead: it
reads one task, answers it, acknowledges it, and reads the next, a round trip each, no pipeline
(the shape the issue's independent driver measured the worker shapes with).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TextIO

import redis

from fsm_celery.core.messages import agent_ack_stream, task_stream

GROUP = "agents"


def stored_ms(entry_id: bytes) -> int:
    """When Redis stored a stream entry, in milliseconds (the first part of its id)."""
    return int(entry_id.split(b"-")[0])


def ack_for(task: dict[str, Any]) -> str:
    return json.dumps(
        {
            "type": "state_ack",
            "machineId": task["machineId"],
            "state": task["state"],
            "attempt": task["attempt"],
            "taskToken": task["taskToken"],
            "success": True,
            "output": {},
        }
    )


class Agent:
    """Reads this agent's tasks in bulk and answers them, at once or paced to a rate."""

    def __init__(self, client: redis.Redis, agent_id: str, rate: float, log: TextIO) -> None:
        prefix = os.environ.get("FSM_CHANNEL_PREFIX", "")
        self.client, self.agent_id, self.rate, self.log = client, agent_id, rate, log
        # FAST_AGENT_TASKS: read another stream, an agent type's (any agent of it may answer)
        reads = os.environ.get("FAST_AGENT_TASKS", agent_id)
        self.tasks, self.acks = task_stream(reads, prefix), agent_ack_stream(agent_id, prefix)
        self.waiting: deque[tuple[bytes, dict[str, Any]]] = deque()
        self.answered_ids: list[bytes] = []  # XACKed and XDELed with the next read
        self.started, self.answered = time.monotonic(), 0
        with contextlib.suppress(redis.ResponseError):  # the group exists already
            client.xgroup_create(self.tasks, GROUP, id="0", mkstream=True)

    def read(self) -> None:
        """Read more tasks when running short, and XACK and XDEL those answered (one round trip
        for many tasks: this agent is part of the load, not of what is measured)."""
        if len(self.waiting) >= 500:
            return
        pipe = self.client.pipeline(transaction=False)
        if self.answered_ids:
            pipe.xack(self.tasks, GROUP, *self.answered_ids)
            pipe.xdel(self.tasks, *self.answered_ids)
            self.answered_ids = []
        block = None if self.waiting else 200
        pipe.xreadgroup(GROUP, self.agent_id, {self.tasks: ">"}, count=1000, block=block)
        found = pipe.execute()[-1]
        for entry_id, fields in found[0][1] if found else []:
            task = json.loads(fields[b"message"])
            if task.get("type") == "state_cancel":  # a timed-out attempt: nothing to answer
                self.answered_ids.append(entry_id)
                continue
            self.log.write(f"T {task['machineId']} {task['attempt']} {stored_ms(entry_id)}\n")
            self.waiting.append((entry_id, task))

    def due(self) -> int:
        """How many acks to send now: every task waiting, or as many as the pace allows."""
        if not self.rate:
            return len(self.waiting)
        allowed = int((time.monotonic() - self.started) * self.rate) - self.answered
        return max(0, min(len(self.waiting), allowed))

    def answer(self, count: int) -> None:
        """Send count acks in one pipeline."""
        sent = [self.waiting.popleft() for _ in range(count)]
        pipe = self.client.pipeline(transaction=False)
        for _, task in sent:
            pipe.xadd(self.acks, {"message": ack_for(task)})
        replies = pipe.execute()
        self.answered_ids.extend(entry_id for entry_id, _ in sent)
        for (_, task), ack_id in zip(sent, replies, strict=True):
            self.log.write(f"A {task['machineId']} {task['attempt']} {stored_ms(ack_id)}\n")
        self.answered += count
        if self.rate and not self.waiting:  # no credit for time spent with nothing to answer
            elapsed = time.monotonic() - self.started
            self.answered = max(self.answered, int(elapsed * self.rate))


def one_at_a_time(agent: Agent, stop: Callable[[], bool]) -> None:
    """Read a task, answer it, acknowledge it: three round trips a task, one task at a time."""
    client = agent.client
    while not stop():
        found: Any = client.xreadgroup(
            GROUP, agent.agent_id, {agent.tasks: ">"}, count=1, block=200
        )
        for entry_id, fields in found[0][1] if found else []:
            task = json.loads(fields[b"message"])
            if task.get("type") != "state_cancel":
                client.xadd(agent.acks, {"message": ack_for(task)})
            client.xack(agent.tasks, GROUP, entry_id)


def main() -> None:
    agent_id = sys.argv[1]
    rate = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    client = redis.Redis.from_url(os.environ["FSM_REDIS_URL"])
    stop = False

    def finish(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, finish)
    with open(os.environ.get("FAST_AGENT_LOG", os.devnull), "a", buffering=1 << 16) as log:
        agent = Agent(client, agent_id, rate, log)
        # As the bridge does: a full collection of everything imported took 50-70 ms here, a
        # core taken from the engine and a burst of delayed acks, which showed as the latency
        # benchmark's worst spikes.
        gc.collect()
        gc.freeze()
        gc.set_threshold(70_000, 20, 100)
        if os.environ.get("FAST_AGENT_ONE_AT_A_TIME"):
            one_at_a_time(agent, lambda: stop)
            return
        while not stop:
            agent.read()
            count = agent.due()
            if count:
                agent.answer(count)
            elif rate:
                time.sleep(0.002)


if __name__ == "__main__":
    main()
