"""The machine engine: load → decide → store → dispatch around the pure core. No Celery here.

One class per use case, each over the same Runtime (database, dispatcher, settings, clock,
definitions). Those that move machines answer with a Next, the states they decided and did
not enter themselves (fsm_celery.engine.ports):

- `admin`: start machines, command them, set their budgets (engine/admin.py);
- `approvals`: people's decisions at approval gates (engine/approvals.py; the gates open as
  engine/kinds/approval.py enters their states);
- `signals`: outside events, applied to a waiting machine or kept for it (engine/signals.py);
- `rewind`, `fork`: a machine back at a past step, or a new one from it (engine/travel.py);
- `replays`: recorded histories run again against a definition, read only (engine/replays.py);
- `entry`: enter a state, the one way a state_task is sent (engine/entry.py), as its kind
  does (engine/kinds: an agent's, a fan-out, an approval gate, a wait);
- `inbox`: apply a batch of agents' messages (engine/inbox.py);
- `tools`: the calls of tool states, read before and applied after (engine/tools.py);
- `scan`: time out attempts and enter due states; prune (engine/scan.py);
- `schedules`: start machines on their definitions' cron ticks (engine/schedules.py);
- `github`: start machines for GitHub issues, once per delivery (engine/github.py);
- `stats`: fold the history into counters, and read them (engine/stats.py);
- `notifier`: send the notifications of machines that ended (engine/notify.py);
- `retention`: the history's months made ahead and, past their retention, archived and
  removed (engine/retention.py);
- `catalog`: the machine definitions (engine/runtime.py).

The decisions are fsm_celery.core's; what a transaction writes is a store.writes.Writes,
which the store turns into SQL. What the engine needs from outside (a Dispatcher, a Handoff)
is declared in engine/ports.py, and given to it by fsm_celery.wiring.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from sqlalchemy import Engine

from fsm_celery.config import Settings
from fsm_celery.core.clock import utcnow
from fsm_celery.core.steps import Next, Step
from fsm_celery.engine.admin import Admin
from fsm_celery.engine.approvals import Approvals
from fsm_celery.engine.entry import EnterNow, Entry, HandOn, Onward
from fsm_celery.engine.github import GitHub
from fsm_celery.engine.inbox import Inbox
from fsm_celery.engine.notify import Notifier
from fsm_celery.engine.ports import Caller, Dispatcher, Handoff, Inbound, Poster, Scanned
from fsm_celery.engine.replays import Replays
from fsm_celery.engine.retention import Retention
from fsm_celery.engine.runtime import Runtime
from fsm_celery.engine.scan import Scan
from fsm_celery.engine.schedules import Schedules
from fsm_celery.engine.signals import Signals
from fsm_celery.engine.stats import Stats
from fsm_celery.engine.tools import Tools
from fsm_celery.engine.travel import Fork, Rewind

__all__ = [
    "Caller",
    "Dispatcher",
    "EnterNow",
    "Entry",
    "HandOn",
    "Handoff",
    "Inbound",
    "Inbox",
    "MachineEngine",
    "Next",
    "Onward",
    "Poster",
    "Scanned",
    "Step",
]


class MachineEngine:
    """The engine's use cases over one database, dispatcher, settings and clock (built by
            fsm_celery.wiring), with what becomes of the states agents' messages and entries decide
            (`onward`: EnterNow inline, HandOn celery), chosen there once, and the way notifications
        are posted (`post`: fsm_celery.channel.webhook's); `away` names the dispatcher's errors when
    its transport is away (Redis's), tried again like the database's."""

    def __init__(
        self,
        db: Engine,
        dispatcher: Dispatcher,
        settings: Settings,
        onward: Onward,
        post: Poster,
        clock: Callable[[], datetime] = utcnow,
        away: tuple[type[Exception], ...] = (),
        caller: Caller | None = None,
    ) -> None:
        self.runtime = Runtime(db, dispatcher, settings, clock, away, caller)
        self.catalog = self.runtime.catalog
        self.entry = Entry(self.runtime, onward)
        self.admin = Admin(self.runtime, self.entry)
        self.approvals = Approvals(self.runtime, self.entry)
        self.signals = Signals(self.runtime, self.entry)
        self.rewind = Rewind(self.runtime, self.entry)
        self.fork = Fork(self.runtime)
        self.replays = Replays(self.runtime)
        self.inbox = Inbox(self.runtime, self.entry)
        self.tools = Tools(self.runtime, self.entry)
        self.scan = Scan(self.runtime, self.entry)
        self.schedules = Schedules(self.runtime, self.admin)
        self.github = GitHub(self.runtime, self.admin, self.approvals)
        self.stats = Stats(self.runtime)
        self.notifier = Notifier(self.runtime, post)
        self.retention = Retention(self.runtime)

    @property
    def db(self) -> Engine:
        return self.runtime.db

    @property
    def settings(self) -> Settings:
        return self.runtime.settings
