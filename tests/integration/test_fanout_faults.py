"""Fan-out with real processes, in both modes: parents joined exactly once through SIGKILLs
of the worker, the bridge and the agents, a Redis restart and a PostgreSQL restart; `any` and
`at_least` joins cancelling their losers; a hundred children ending while the parent is
cancelled, without a deadlock; and pause, resume and cancel carried three levels down by the
CLI."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import redis
from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError

from fsm_celery.core.messages import ack_channel, task_channel
from fsm_celery.exceptions import CommandRefused
from fsm_celery.store.tables import machines, transitions
from tests.integration.fan_agent import answer
from tests.support.agents import ScriptedAgent
from tests.support.databases import create_template
from tests.support.messages import SILENT, Reply, ack_for
from tests.support.processes import TERMINAL, FsmEnv, Proc, make_env
from tests.support.services import Postgres, RedisServer, Services

PARENTS = 100
CHILDREN = 10  # of each parent
AGENT_TYPES = ("tester", "writer", "docwriter")
# A transaction killed between its send and its commit is done again, its tasks sent again:
# the first copy was heard at most this long before the kill, or (the counter lagging) after it.
CRASH_WINDOW = (-10.0, 2.0)
TESTER = "5e7a1c1e-0000-4000-8000-00000000fa11"  # the scripted agent of the module's tests
STATUS_EVERY = 2.0  # seconds between its status reports


# ---- the fault run ---------------------------------------------------------------------------


def _parent(i: int) -> tuple[str, dict[str, Any]]:
    """The i-th parent: ten parallel branches, a map of ten items three at a time, or a map of
    ten child machines (test_fan_step) five at a time."""
    kind = ("test_fan_ten", "test_fan_map10", "test_fan_steps")[i % 3]
    if kind == "test_fan_ten":
        return kind, {"n": i}
    return kind, {"n": i, "items": [f"{i}.{k}" for k in range(CHILDREN)]}


def _merged(kind: str, context: dict[str, Any]) -> dict[str, Any]:
    """What the parent's join merges into its context, as a run without faults gives it (the
    agents' answers are fixed by their tasks)."""
    if kind == "test_fan_ten":
        return {
            f"b{k}": {"answer": answer(f"test_fan_ten.FAN.b{k}", "WORK", context)}
            for k in range(CHILDREN)
        }
    if kind == "test_fan_map10":
        body, state, key = "test_fan_map10.EACH", "WORK", "results"
    else:
        body, state, key = "test_fan_step", "STEP", "steps"
    return {key: [{"answer": answer(body, state, {"item": it})} for it in context["items"]]}


class Dispatches:
    """Every state_task sent, counted per (machine, attempt) as it is sent: a dispatch is a
    PUBLISH on the agent's channel beside its XADD (which the agent deletes once answered).
    Subscribed again after a Redis restart: what is sent while it is away is not counted."""

    def __init__(self, env: FsmEnv) -> None:
        self._url = env.settings.redis_url
        self._pattern = task_channel("*", env.settings.channel_prefix)
        self.seen: dict[tuple[str, int], list[float]] = {}
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Dispatches:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the dispatch counter did not subscribe")
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._listen()
            except redis.ConnectionError:
                time.sleep(0.1)  # Redis restarting

    def _listen(self) -> None:
        with redis.Redis.from_url(self._url) as client:
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            pubsub.psubscribe(self._pattern)
            self._ready.set()
            while not self._stop.is_set():
                message = pubsub.get_message(timeout=0.1)
                if message is None:
                    continue
                task = json.loads(message["data"])
                if task.get("type") == "state_task":
                    key = (task["machineId"], task["attempt"])
                    self.seen.setdefault(key, []).append(time.monotonic())

    def twice(self, crashes: list[float]) -> tuple[int, dict[tuple[str, int], int]]:
        """How many attempts were sent twice in the moments before a process was killed (a
        transaction killed between its send and its commit is done again: at least once), and
        those sent twice at any other time."""
        explained, unexplained = 0, {}
        for key, times in self.seen.items():
            if len(times) < 2:
                continue
            first = times[0]
            before, after = CRASH_WINDOW
            if len(times) == 2 and any(before <= first - kill <= after for kill in crashes):
                explained += 1
            else:
                unexplained[key] = len(times)
        return explained, unexplained


@dataclass
class Servers:
    """A deployment on a PostgreSQL and a Redis of its own, and the faults the test makes."""

    env: FsmEnv
    postgres: Postgres
    redis: RedisServer
    agent_ids: dict[str, str]  # agent type -> its fixed id, the same after a restart
    crashes: list[float] = field(default_factory=list)  # when a sender of tasks was killed
    worker: Proc | None = None
    agents: list[Proc] = field(default_factory=list)
    _restarting: list[threading.Thread] = field(default_factory=list)
    _failed: list[BaseException] = field(default_factory=list)

    def start(self) -> None:
        """The processes, the agents reported before any child is routed."""
        self.env.start_bridge(processes=2)
        self.worker = self.env.start_worker(beat=True)
        self.start_agents()
        self.env.wait_for_agents(len(self.agent_ids))

    def start_agents(self) -> None:
        self.agents = [
            self.env.start_agent(
                "tests/integration/fan_agent.py",
                agent_type,
                agent_id,
                extra_env={"FAN_AGENT_THINK": "0.4"},
            )
            for agent_type, agent_id in self.agent_ids.items()
        ]

    def _in_background(self, start: Callable[[], object]) -> None:
        """Start a process again while the run goes on (a process manager would), so that the
        next fault comes when the children have moved on, not when the process is back."""

        def run() -> None:
            try:
                start()
            except BaseException as exc:
                self._failed.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self._restarting.append(thread)

    def settle(self) -> None:
        """Wait until the processes killed are back (one fault at a time)."""
        for thread in self._restarting:
            thread.join(60)
        self._restarting.clear()
        if self._failed:
            raise self._failed[0]

    def kill_worker(self) -> None:
        """SIGKILL to the worker (its tasks, the scan's beat) mid-transaction, and a new one."""
        assert self.worker is not None
        self.crashes.append(time.monotonic())
        self.worker.kill()

        def start() -> None:
            self.worker = self.env.start_worker(beat=True)

        self._in_background(start)

    def kill_bridge(self) -> None:
        """SIGKILL to both bridge processes, mid-batch, and new ones."""
        self.crashes.append(time.monotonic())
        for proc in self.env.procs:
            if proc.name == "bridge":
                proc.kill()
        self._in_background(lambda: self.env.start_bridge(processes=2))

    def kill_agents(self) -> None:
        """SIGKILL to every agent with tasks in hand; back with the same ids, they read the
        tasks they had not answered again."""
        for proc in self.agents:
            proc.kill()
        self.start_agents()

    def restart_redis(self) -> None:
        """Everything in Redis is lost: tasks, acks, Celery's queue."""
        self.redis.restart(down=0.5)

    def restart_postgres(self) -> None:
        self.postgres.restart()


SPACING = 50  # children that end between two faults, at least
FAULTS = (  # (children ended, in tenths of them all; the fault)
    (1, Servers.kill_worker),
    (2.5, Servers.kill_bridge),
    (4, Servers.kill_agents),
    (5.5, Servers.restart_redis),
    (7, Servers.restart_postgres),
)


@pytest.fixture
def servers(mode: str) -> Iterator[Servers]:
    # not tmp_path: pytest's directories are 0700 and the server may run as `postgres`
    directory = Path(tempfile.mkdtemp(prefix="fsm-celery-fan-"))
    postgres = Postgres(directory / "postgres").init().start()
    (directory / "redis").mkdir()
    redis_server = RedisServer(directory / "redis")
    create_template(postgres.url, "template_fsm")
    env = make_env(
        f"fan_faults_{mode}",
        postgres.url,
        "template_fsm",
        redis_server.url,
        transition_mode=mode,
        stream_claim_idle_seconds=1.0,
        dispatch_grace_seconds=2.0,
        visibility_timeout_seconds=10,
        worker_rounds_at_once=2,  # a second transaction beside a running one: joins stay once
    )
    agents = {t: str(uuid.uuid5(uuid.NAMESPACE_URL, f"fan-faults:{mode}:{t}")) for t in AGENT_TYPES}
    yield Servers(env, postgres, redis_server, agents)
    env.stop_all()
    env.client.engine.db.dispose()
    redis_server.stop()
    postgres.stop()
    shutil.rmtree(directory, ignore_errors=True)


def _children_ended(env: FsmEnv) -> int:
    """How many children have ended (0 while the database restarts)."""
    return _children(env).get("ended", 0)


def _children(env: FsmEnv) -> Counter[str]:
    """The children, ended or running (none while the database restarts)."""
    ended = machines.c.status.in_(TERMINAL)
    try:
        with env.client.engine.db.connect() as conn:
            rows = conn.execute(
                select(ended, func.count()).where(machines.c.parent_id.is_not(None)).group_by(ended)
            ).all()
    except OperationalError:
        return Counter()
    return Counter({"ended" if done else "running": n for done, n in rows})


def _wait_for_children(env: FsmEnv, ended: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while (now := _children_ended(env)) < ended:
        assert time.monotonic() < deadline, f"only {now} children ended, waiting for {ended}"
        time.sleep(0.05)


def _history(env: FsmEnv, ids: list[UUID]) -> dict[UUID, list[Any]]:
    """Each machine's history rows, by attempt."""
    found: dict[UUID, list[Any]] = {mid: [] for mid in ids}
    with env.client.engine.db.connect() as conn:
        rows = conn.execute(
            select(transitions)
            .where(transitions.c.machine_id.in_(ids))
            .order_by(transitions.c.machine_id, transitions.c.attempt, transitions.c.id)
        ).all()
    for row in rows:
        found[row.machine_id].append(row)
    return found


def _children_of(env: FsmEnv, parents: list[UUID]) -> list[Any]:
    with env.client.engine.db.connect() as conn:
        return list(conn.execute(select(machines).where(machines.c.parent_id.in_(parents))).all())


def _ending(row: Any) -> bool:
    """A history row that ended its machine: into a terminal state, or a cancel."""
    return row.event == "cancel" or row.to_state in ("DONE", "FAILED")


def _assert_each_ended_once(env: FsmEnv, ids: list[UUID]) -> None:
    for mid, rows in _history(env, ids).items():
        endings = [(r.event, r.to_state) for r in rows if _ending(r)]
        assert len(endings) == 1, f"{mid} ended {len(endings)} times: {endings}"
        assert _ending(rows[-1]), f"{mid}: something was recorded after its end"


def test_parents_join_once_with_the_same_output_through_every_fault(
    servers: Servers, mode: str
) -> None:
    """A hundred parents of ten children each, through one fault after another while children
    run: every parent joins once, with the output a run without faults merges; every child
    ends once; and no attempt is sent twice but by a transaction killed after its send."""
    env, began = servers.env, time.monotonic()
    total = PARENTS * CHILDREN
    servers.start()
    timeline = []
    with Dispatches(env) as dispatches:
        started = [_parent(i) for i in range(PARENTS)]
        ids = [env.client.start_machine(kind, context) for kind, context in started]
        ended = 0
        for tenths, fault in FAULTS:
            floor = max(int(total * tenths / 10), ended + SPACING)
            _wait_for_children(env, min(floor, total * 9 // 10))
            servers.settle()
            children, at = _children(env), time.monotonic() - began
            ended = children["ended"]
            fault(servers)
            timeline.append(
                f"{fault.__name__} at {at:.1f}s ({ended} ended, {children['running']} running)"
            )
        servers.settle()
        infos = [env.wait_until_done(mid, timeout=180) for mid in ids]
        elapsed = time.monotonic() - began
    assert [info.status for info in infos] == ["completed"] * PARENTS
    for (kind, context), info in zip(started, infos, strict=True):
        merged = _merged(kind, context)
        assert {key: info.context.get(key) for key in merged} == merged, info.id
    histories = _history(env, ids)
    for mid, rows in histories.items():
        assert [r.event for r in rows].count("join") == 1, f"{mid}: {[r.event for r in rows]}"
    children = _children_of(env, ids)
    assert len(children) == total
    assert {c.status for c in children} == {"completed"}
    _assert_each_ended_once(env, [c.id for c in children])
    server_log = (servers.postgres.directory / "postgres.log").read_text(errors="replace")
    assert "deadlock detected" not in server_log  # two bridge processes, children, joins
    assert len(dispatches.seen) >= total * 9 // 10  # the counter heard the run
    explained, unexplained = dispatches.twice(servers.crashes)
    assert unexplained == {}, f"state_tasks sent more than once: {unexplained}"
    rejections = env.client.rejected(limit=100_000)
    rejected = Counter(r["reason"] for r in rejections)
    unusual = [r["detail"] for r in rejections if r["reason"] != "stale_attempt"][:5]
    events = Counter(
        r.event for rows in _history(env, [c.id for c in children]).values() for r in rows
    )
    print(
        f"\n{mode}: {PARENTS} parents, {total} children in {elapsed:.1f}s; "
        f"{', '.join(timeline)}; {len(dispatches.seen)} attempts dispatched, {explained} twice "
        f"by a killed transaction; children's history {dict(events)}; rejected {dict(rejected)} "
        f"{unusual if unusual else ''}"
    )


# ---- a deployment on the suite's servers, with one scripted agent ------------------------------


@pytest.fixture(scope="module")
def fan(env_factory: Callable[..., FsmEnv], mode: str) -> Iterator[FsmEnv]:
    env = env_factory(f"fan_{mode}", transition_mode=mode)
    env.start_worker()
    env.start_bridge()
    yield env
    env.stop_all()


@contextmanager
def scripted_tester(
    env: FsmEnv, script: dict[str, list[Reply]] | None = None, gate: threading.Event | None = None
) -> Iterator[ScriptedAgent]:
    """The module's agent of type tester, reported active (and again every STATUS_EVERY
    seconds, as an agent does: after FSM_AGENT_LIVENESS_SECONDS of silence it would get no
    new work, its children's tasks going to the type's channel, which it does not read), so
    that children (which have no agent of their own) are routed to it."""
    with ScriptedAgent(env, script, gate=gate, agent_id=TESTER) as agent:
        status = {
            "type": "agent_status",
            "agentId": TESTER,
            "agentType": "tester",
            "status": "active",
            "concurrency": 100,
        }
        before = time.time()
        agent.send(status)
        deadline = time.monotonic() + 15
        while not any(
            a["id"] == TESTER and _seen_since(a["last_seen_at"], before)
            for a in env.client.agents()
        ):
            assert time.monotonic() < deadline, "the agent's status was not applied"
            time.sleep(0.05)
        stop = threading.Event()

        def report() -> None:
            while not stop.wait(STATUS_EVERY):
                agent.send(status)

        reporter = threading.Thread(target=report, daemon=True)
        reporter.start()
        try:
            yield agent
        finally:
            stop.set()
            reporter.join(5)


def _seen_since(last_seen: str, since: float) -> bool:
    return datetime.fromisoformat(last_seen).timestamp() >= since - 1


def _kids(env: FsmEnv, parent: UUID) -> list[Any]:
    with env.client.engine.db.connect() as conn:
        return list(
            conn.execute(
                select(machines).where(machines.c.parent_id == parent).order_by(machines.c.slot)
            ).all()
        )


def _wait_for_kids_to_end(env: FsmEnv, parent: UUID) -> None:
    _wait_until(lambda: all(k.status in TERMINAL for k in _kids(env, parent)), "children ended")


def _wait_until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
        time.sleep(0.05)


@pytest.mark.parametrize(
    ("definition", "branches", "winners"),
    [
        ("test_fan_any", 3, 1),
        ("test_fan_at_least", 4, 2),
    ],
)
def test_an_any_or_at_least_join_cancels_the_losers_whose_late_acks_change_nothing(
    fan: FsmEnv, definition: str, branches: int, winners: int
) -> None:
    gate = threading.Event()  # every child has its task before any answer goes
    script = {"GO": [Reply(output={"won": True})] * winners + [SILENT] * (branches - winners)}
    with scripted_tester(fan, script, gate) as agent:
        mid = fan.client.start_machine(definition, {})
        agent.wait_for_tasks(branches, timeout=30)
        gate.set()
        parent = fan.wait_until_done(mid)
        assert parent.status == "completed"
        kids = {str(k.id): k for k in _kids(fan, mid)}
        _wait_for_kids_to_end(fan, mid)
        losers = agent.tasks[winners:]
        before = (fan.client.get_machine(mid).context, _history(fan, [UUID(k) for k in kids]))
        for task in losers:
            agent.send(ack_for(task, Reply(output={"won": "late"})))
        rejected = [fan.wait_for_rejections(UUID(t["machineId"]), 1) for t in losers]
    assert [[r["reason"] for r in found] for found in rejected] == [["stale_attempt"]] * len(losers)
    after = (fan.client.get_machine(mid).context, _history(fan, [UUID(k) for k in kids]))
    assert after == before  # the late acks changed nothing
    statuses = {branch: k.status for branch, k in ((k.branch, k) for k in _kids(fan, mid))}
    won = {kids[t["machineId"]].branch for t in agent.tasks[:winners]}
    assert statuses == {b: "completed" if b in won else "cancelled" for b in statuses}
    assert {b: parent.context[b] for b in won} == {b: {"won": True} for b in won}
    for branch in set(statuses) - won:
        assert parent.context[branch] == {"status": "cancelled", "error": "cancelled by the join"}
    assert [r.event for r in _history(fan, [mid])[mid]].count("join") == 1
    _assert_each_ended_once(fan, [UUID(k) for k in kids])


DELAYS = (0.0, 0.004, 0.008, 0.012, 0.016, 0.024, 0.032, 0.05)  # acks sent -> cancel, s
HUNDRED = 100


def test_a_hundred_children_ending_while_their_parent_is_cancelled_never_deadlock(
    fan: FsmEnv, mode: str, services: Services
) -> None:
    """Each round a hundred children's acks are published at once and an admin cancels their
    parent a little later each time: the join and the cancel lock the parent first, then the
    children, so neither waits on the other in a cycle."""
    outcomes: list[tuple[str, int]] = []  # how each round ended, and the children completed
    server_log = _server_log(services)
    logged = server_log.stat().st_size if server_log else 0
    channel = ack_channel(fan.settings.channel_prefix)
    for delay in DELAYS:
        with scripted_tester(fan, {"WORK": [SILENT] * HUNDRED}) as agent:
            mid = fan.client.start_machine("test_fan_hundred", {"items": list(range(HUNDRED))})
            agent.wait_for_tasks(HUNDRED, timeout=60)
            pipe = fan.redis.pipeline(transaction=False)
            for task in agent.tasks:
                pipe.publish(channel, json.dumps(ack_for(task)))
            pipe.execute()
            time.sleep(delay)
            with suppress(CommandRefused):  # the join came first: the parent has completed
                fan.client.cancel(mid, "admin", "the deadlock test")
            parent = fan.wait_until_done(mid, timeout=60)
            _wait_for_kids_to_end(fan, mid)
        kids = _kids(fan, mid)
        events = [r.event for r in _history(fan, [mid])[mid]]
        assert parent.status in ("completed", "cancelled")
        ended_by = "join" if parent.status == "completed" else "cancel"
        assert (events.count("join"), events.count("cancel")) == (
            (1, 0) if ended_by == "join" else (0, 1)
        ), events
        assert len(kids) == HUNDRED
        _assert_each_ended_once(fan, [k.id for k in kids])
        outcomes.append((ended_by, sum(k.status == "completed" for k in kids)))
    logs = {proc.log.name: proc.log.read_text(errors="replace") for proc in fan.procs}
    assert [name for name, text in logs.items() if "deadlock" in text.lower()] == []
    if server_log is not None:  # PostgreSQL's own word: ERROR: deadlock detected
        with server_log.open(errors="replace") as log:
            log.seek(logged)
            assert "deadlock detected" not in log.read()
    assert fan.client.parked() == []
    print(f"\n{mode}: rounds (ended by, children completed) at {DELAYS} s: {outcomes}")


def _server_log(services: Services) -> Path | None:
    """The log of the suite's own PostgreSQL server (None on a server the environment names)."""
    if services.postgres is None:
        return None
    return services.postgres.directory / "postgres.log"


def _cli(env: FsmEnv, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "fsm_celery", *args],
        env=env.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_pause_resume_and_cancel_reach_three_levels_down_through_the_cli(fan: FsmEnv) -> None:
    with scripted_tester(fan, {"FIRST": [SILENT] * 3}) as agent:
        root = fan.client.start_machine("test_fan_tree", {"left": "l"})
        first = agent.wait_for_tasks(1)  # test_pair's FIRST, two levels down
        assert first["machineType"] == "test_pair"
        # a state_task goes out before the transaction that sent it commits: wait for its rows
        _wait_until(lambda: len(_kids(fan, root)) == 1, "the child recorded")
        [child] = _kids(fan, root)
        _wait_until(lambda: len(_kids(fan, child.id)) == 1, "the grandchild recorded")
        [grandchild] = _kids(fan, child.id)
        tree = [root, child.id, grandchild.id]
        assert str(grandchild.id) == first["machineId"]

        def statuses() -> list[str]:
            return [fan.client.get_machine(mid).status for mid in tree]

        _cli(fan, "pause", str(root), "--actor", "ops", "--reason", "tree test")
        _wait_until(lambda: statuses() == ["paused"] * 3, "the tree paused")
        _cli(fan, "resume", str(root), "--actor", "ops")
        _wait_until(lambda: statuses() == ["running"] * 3, "the tree resumed")
        again = agent.wait_for_tasks(2)  # its state entered again, as a new attempt
        assert (again["machineId"], again["state"]) == (first["machineId"], "FIRST")
        assert again["attempt"] > first["attempt"]
        _cli(fan, "cancel", str(root), "--actor", "ops")
        _wait_until(lambda: statuses() == ["cancelled"] * 3, "the tree cancelled")
        agent.send(ack_for(again))  # too late: its machine was cancelled
        [late] = fan.wait_for_rejections(grandchild.id, 1)
    assert late["reason"] == "stale_attempt"
    _assert_each_ended_once(fan, tree)
    history = _history(fan, tree)
    for mid in tree[1:]:
        commands = [(r.event, r.actor) for r in history[mid] if r.event in ("pause", "resume")]
        assert commands == [("pause", "parent"), ("resume", "parent")], commands
