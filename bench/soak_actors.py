"""The soak's actors (bench/soak.py), threads of the soak process, each with a client of its own:
the load that starts machines of every kind, a scripted approver, an event sender, an operator
who rewinds and forks, and a viewer who reads the dashboards. Each records what it did in the
journal, which the end checks hold PostgreSQL's records against (bench/soak_checks.py).

An action that raised may still have been committed (PostgreSQL restarting between the commit
and its reply): the approver and the sender then do it again with the same choice and key, as
a client that lost a reply should, and the product must count it once; the operator, whose
rewinds and forks have no key, marks the machine uncertain (one more rewind may be recorded).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any
from uuid import UUID

import httpx
from sqlalchemy import text

from fsm_celery import wiring
from fsm_celery.client import Client
from fsm_celery.config import Settings
from fsm_celery.exceptions import MachineError
from tests.support.credentials import VIEWER_TOKEN

# kind -> machine type (bench/definitions/soak_*.yaml); a fork is a soak_loop started by fork
KINDS = {
    "loop": "soak_loop",
    "map": "soak_map",
    "parallel": "soak_parallel",
    "gate": "soak_gate",
    "wait": "soak_wait",
}
EVENT = "soak_go"
APPROVER, SENDER, OPERATOR = "soak-approver", "soak-sender", "soak-operator"
IN_FLIGHT = 30  # root machines running at once, at most
REJECTED = 0.2  # the share of gates the approver rejects, drawn gate by gate
RUNNING_ROOTS = text(
    "SELECT count(*) FROM state_machines "
    "WHERE parent_id IS NULL AND status IN ('running', 'paused')"
)


@dataclass
class Journal:
    """What the actors did, for the end checks."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    started: dict[UUID, str] = field(default_factory=dict)  # machine -> kind (or "fork")
    started_at: dict[UUID, float] = field(default_factory=dict)
    choices: dict[tuple[UUID, int], str] = field(default_factory=dict)  # gate -> the decision
    decisions: dict[tuple[UUID, int], list[dict[str, Any]]] = field(default_factory=dict)
    events: dict[UUID, list[str]] = field(default_factory=dict)  # machine -> each outcome
    rewinds: dict[UUID, list[int]] = field(default_factory=dict)  # machine -> rewind steps
    forks: dict[UUID, UUID] = field(default_factory=dict)  # fork -> source
    uncertain: set[UUID] = field(default_factory=set)  # an operator's action raised
    refused: Counter[str] = field(default_factory=Counter)  # actor: exception, as expected
    errors: Counter[str] = field(default_factory=Counter)  # actor: exception, a fault's
    reads: Counter[str] = field(default_factory=Counter)  # the viewer's: ok, failed

    def start(self, machine_id: UUID, kind: str) -> None:
        with self.lock:
            self.started[machine_id] = kind
            self.started_at[machine_id] = time.monotonic()

    def of_kind(self, kind: str) -> list[tuple[UUID, float]]:
        with self.lock:
            return [(m, self.started_at[m]) for m, k in self.started.items() if k == kind]


class Actor(threading.Thread):
    """Calls tick() every `period` seconds until stopped; what it raises is counted."""

    label = "actor"
    period = 1.0

    def __init__(self, settings: Settings, journal: Journal, seed: int) -> None:
        super().__init__(daemon=True, name=f"soak-{self.label}")
        self.client: Client = wiring.client(settings)
        self.journal = journal
        self.rng = random.Random(f"{seed}:{self.label}")
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.wait(self.period):
            self.attempt(self.tick)

    def attempt(self, action: Callable[[], object]) -> bool:
        """Run the action; False, counted, when it raised."""
        try:
            action()
        except MachineError as exc:
            self.journal.refused[f"{self.label}: {type(exc).__name__}"] += 1
            return False
        except Exception as exc:
            self.journal.errors[f"{self.label}: {type(exc).__name__}"] += 1
            return False
        return True

    def tick(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        self._stopping.set()
        self.join(60)
        self.client.engine.db.dispose()


class Load(Actor):
    """Starts machines of every kind, one a tick while fewer than IN_FLIGHT roots run."""

    label = "load"
    period = 0.5

    def tick(self) -> None:
        with self.client.engine.db.connect() as conn:
            if int(conn.execute(RUNNING_ROOTS).scalar_one()) >= IN_FLIGHT:
                return
        kind = self.rng.choice(sorted(KINDS))
        context: dict[str, Any] = {}
        if kind == "map":
            context["items"] = [f"item{k}" for k in range(self.rng.randint(2, 5))]
        self.journal.start(self.client.start_machine(KINDS[kind], context), kind)


class Approver(Actor):
    """Decides each open soak_gate gate once: approve, or reject (REJECTED of the time), the
    choice drawn once per gate and repeated if the reply was lost."""

    label = "approver"
    period = 0.5

    def tick(self) -> None:
        for gate in self.client.approvals(limit=1000, machine_type=KINDS["gate"]):
            key = (UUID(str(gate["machine_id"])), int(gate["attempt"]))
            if key in self.journal.decisions:
                continue
            choice = self.journal.choices.setdefault(
                key, "reject" if self.rng.random() < REJECTED else "approve"
            )
            self.attempt(partial(self._decide, key, choice))

    def _decide(self, key: tuple[UUID, int], choice: str) -> None:
        machine_id, attempt = key
        fields = {"target": "staging"} if choice == "approve" else None
        done = self.client.decide(
            machine_id, choice, APPROVER, fields=fields, comment="soak", attempt=attempt
        )
        with self.journal.lock:
            self.journal.decisions.setdefault(key, []).append(
                {k: done.get(k) for k in ("recorded", "verdict", "override")}
            )


class Sender(Actor):
    """Sends each soak_wait machine its event, under a key of its own, between 0 and 6 seconds
    after its start (before it waits, often: kept, then applied), and again 2 seconds later
    (a resend: the same key, so a duplicate)."""

    label = "sender"
    period = 0.5

    def __init__(self, settings: Settings, journal: Journal, seed: int) -> None:
        super().__init__(settings, journal, seed)
        self.due: dict[UUID, float] = {}  # machine -> when its next send is due

    def tick(self) -> None:
        now = time.monotonic()
        for machine_id, started_at in self.journal.of_kind("wait"):
            sent = len(self.journal.events.get(machine_id, []))
            if sent >= 2:
                continue
            due = self.due.setdefault(machine_id, started_at + self.rng.uniform(0, 6))
            if now >= due and self.attempt(partial(self._send, machine_id)):
                self.due[machine_id] = now + 2

    def _send(self, machine_id: UUID) -> None:
        done = self.client.send_event(
            machine_id, EVENT, {"go": True}, SENDER, key=f"soak-{machine_id}"
        )
        with self.journal.lock:
            self.journal.events.setdefault(machine_id, []).append(str(done["outcome"]))


class Operator(Actor):
    """Every few seconds, rewinds a running soak_loop machine to step 1 or forks one from it,
    each machine at most once."""

    label = "operator"
    period = 4.0

    def __init__(self, settings: Settings, journal: Journal, seed: int) -> None:
        super().__init__(settings, journal, seed)
        self.touched: set[UUID] = set()

    def tick(self) -> None:
        candidates = [m for m, _ in self.journal.of_kind("loop") if m not in self.touched]
        for machine_id in self.rng.sample(candidates, min(5, len(candidates))):
            info = self.client.get_machine(machine_id)
            if info.status == "running" and info.attempt >= 3:
                self.touched.add(machine_id)
                action = self._rewind if self.rng.random() < 0.5 else self._fork
                if not self.attempt(partial(action, machine_id)):
                    with self.journal.lock:
                        self.journal.uncertain.add(machine_id)
                return

    def _rewind(self, machine_id: UUID) -> None:
        rewound = self.client.rewind(machine_id, 1, OPERATOR, "soak: back to step 1")
        with self.journal.lock:
            self.journal.rewinds.setdefault(machine_id, []).append(rewound.step)

    def _fork(self, machine_id: UUID) -> None:
        fork = self.client.fork(machine_id, 1, OPERATOR, "soak: a fork from step 1")
        self.journal.start(fork, "fork")
        with self.journal.lock:
            self.journal.forks[fork] = machine_id


class Viewer(Actor):
    """Reads each dashboard's machine list and counts, as a viewer's browser would."""

    label = "viewer"
    period = 1.0

    def __init__(
        self, settings: Settings, journal: Journal, seed: int, urls: Callable[[], list[str]]
    ) -> None:
        super().__init__(settings, journal, seed)
        self.urls = urls
        self.http = httpx.Client(timeout=10, headers={"Authorization": f"Bearer {VIEWER_TOKEN}"})

    def tick(self) -> None:
        for url in self.urls():
            for path in ("/api/machines?limit=20", "/api/machines/count"):
                try:
                    ok = self.http.get(url + path).status_code == 200
                except httpx.HTTPError:
                    ok = False  # a dashboard killed or starting: counted, not raised
                self.journal.reads["ok" if ok else "failed"] += 1

    def stop(self) -> None:
        super().stop()
        self.http.close()
