"""What the engine needs from the world and what it hands back, declared here, on its side.

Adapters implement these (fsm_celery.channel sends state_tasks, fsm_celery.acks reads agents'
messages, fsm_celery.worker sends Celery tasks); they import this module, never the reverse:

- `Inbound`: a raw message from an agent, as the acks side read it;
- `Next` (of `Step`s, fsm_celery.core.steps): what a use case decided and did not enter;
- `Dispatcher`: how state_tasks, state_cancels and transition events leave;
- `Handoff`: how a Next is entered later (an fsm.enter_state task per step, normally);
- `Caller`: how the tool states a transaction entered get their calls made (an fsm.call_tool
  task each);
- `Webhook` and `Poster`: how notifications leave (fsm_celery.channel.webhook POSTs them);
- `Observer`: who is told what each committed transaction did (fsm_celery.metrics counts it).

What becomes of the states a transaction moved machines to (entered here, or handed on) is
the engine's own port, `engine.entry.Onward`, chosen once where the process is built.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol
from uuid import UUID

from fsm_celery.core.steps import Next

if TYPE_CHECKING:
    from fsm_celery.core.messages import StateEvent
    from fsm_celery.store.writes import Writes


class Inbound(NamedTuple):
    """A raw message from Redis, and the agent that sent it when where it came from says so
    (its own ack stream, which only it may write under the Redis ACLs), and when it was stored
    (a stream entry's time, unix seconds; None when not known)."""

    raw: str
    agent: UUID | None = None
    stored_at: float | None = None


class Scanned(NamedTuple):
    """What a scan did: how many machines it handled (a full batch: scan again at once), and
    its Next."""

    handled: int
    next: Next


class Handoff(Protocol):
    """Has each step of a Next entered later, after its delay (fsm_celery.worker.enqueue sends
    an fsm.enter_state task each). May raise a transient error: the steps are then entered by
    the scan, which enters every state whose dispatch is due."""

    def __call__(self, next_states: Next, /) -> None: ...


class Caller(Protocol):
    """Has the call of each tool state entered made, by a worker, once the transaction that
    entered it committed (fsm_celery.worker.tools sends an fsm.call_tool task each). May raise:
    the transaction committed all the same, and an attempt whose call was never made times out
    and is retried as any other."""

    def __call__(self, calls: Next, /) -> None: ...


class Dispatcher(Protocol):
    """Delivers state_tasks to agents (a uuid, or an agent type for unassigned machines), and
    announces committed transitions to whoever listens."""

    def dispatch_many(self, messages: list[tuple[str, str]]) -> None:
        """Send each (agent, message), all in as few round trips as the transport allows."""
        ...

    def cancel_many(self, messages: list[tuple[str, str]]) -> None:
        """Send each (agent, state_cancel or state_ack_refused) where the agent reads it (its
        task stream); never raises: the transaction committed, and an agent that misses it
        learns from its next task (a refusal missed: the attempt times out and is retried)."""
        ...

    def announce(self, events: Sequence[StateEvent]) -> None:
        """Publish the events on the events channel; never raises (a listener may miss them,
        a transition must not fail for it)."""
        ...


class Webhook(NamedTuple):
    """A notification to send: its receiver, its body and its headers (signed)."""

    url: str
    body: bytes
    headers: Mapping[str, str]


class Poster(Protocol):
    """Sends webhooks, all at once as far as it can, each within `timeout` seconds; for each,
    in order, None when its receiver took it, else what went wrong. Never raises."""

    def __call__(self, hooks: Sequence[Webhook], timeout: float, /) -> list[str | None]: ...


class Observer(Protocol):
    """Told what each transaction did, once it committed (fsm_celery.metrics counts it);
    called on the hot path, so it must be cheap, and never raises. A process that counts
    nothing has none (Runtime.observer None: not even a call is made)."""

    def committed(self, writes: Writes, /) -> None:
        """The transaction's transitions (writes.log), history and rejections."""
        ...

    def acks_applied(self, writes: Writes, applied: Sequence[tuple[Any, Inbound]], /) -> None:
        """A batch of agents' messages (each (message, as read)) was applied by writes."""
        ...

    def event(self, outcome: str, /) -> None:
        """An outside event was sent: applied, kept, duplicate or refused."""
        ...
