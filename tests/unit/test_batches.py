"""The batch applier's policy: a batch that fails is split until the message that breaks it is
found and recorded; transient failures go back to the caller, which keeps the batch; a message
that cannot even be recorded is handed back to the caller."""

from __future__ import annotations

import uuid
from typing import cast

import pytest
import redis

from fsm_celery.batches import BatchApplier
from fsm_celery.core.transition import RejectReason
from fsm_celery.engine import Inbound, MachineEngine, Next, Step


class Engine:
    """An engine's inbox that applies any batch that holds no poisoned message, and records
    what it is told to reject, unless the message is one it cannot even record."""

    def __init__(
        self,
        poisoned: set[str],
        delay: float = 0.0,
        error: Exception | None = None,
        unrecordable: frozenset[str] = frozenset(),
    ):
        self.poisoned, self.delay, self.error = poisoned, delay, error
        self.unrecordable = unrecordable
        self.applied: list[list[str]] = []
        self.rejected: list[tuple[str, RejectReason, str]] = []
        self.memories: list[object] = []  # the Sent each try was given
        self.inbox = self

    def apply(self, batch: list[Inbound], *, enter: bool = True, sent: object = None) -> Next:
        self.memories.append(sent)
        if self.error is not None:
            raise self.error
        payloads = [item.raw for item in batch]
        if self.poisoned & set(payloads):
            raise ValueError("unsupported Unicode escape sequence\nDETAIL: more")
        self.applied.append(payloads)
        self.entered_inline = enter
        steps = [Step(uuid.uuid4(), 2, self.delay) for _ in payloads]
        return [step for step in steps if step.delay > 0] if enter else steps

    def reject(self, raw: str, reason: RejectReason, detail: str) -> None:
        if raw in self.unrecordable:
            raise ValueError("integer out of range")
        self.rejected.append((raw, reason, detail))


def _batch(*payloads: str) -> list[Inbound]:
    return [Inbound(p) for p in payloads]


def _applier(engine: Engine, entered: list[Step], inline: bool = True) -> BatchApplier:
    return BatchApplier(cast(MachineEngine, engine), entered.extend, inline=inline)


def test_a_healthy_batch_is_applied_in_one_go() -> None:
    engine, entered = Engine(set()), list[Step]()
    assert _applier(engine, entered)(_batch("a", "b", "c")) == []
    assert engine.applied == [["a", "b", "c"]]
    assert engine.rejected == []


def test_a_message_that_breaks_its_batch_is_rejected_and_the_others_applied() -> None:
    engine, entered = Engine({"b"}), list[Step]()
    assert _applier(engine, entered)(_batch("a", "b", "c")) == []
    assert engine.applied == [["a"], ["c"]]
    assert engine.rejected == [
        ("b", RejectReason.UNPROCESSABLE, "ValueError: unsupported Unicode escape sequence")
    ]


@pytest.mark.parametrize(
    "error", [redis.ConnectionError("gone"), redis.TimeoutError("slow")], ids=repr
)
def test_a_transient_error_is_raised_and_nothing_is_rejected(error: Exception) -> None:
    engine, entered = Engine(set(), error=error), list[Step]()
    with pytest.raises(type(error)):
        _applier(engine, entered)(_batch("a", "b"))
    assert engine.rejected == []


def test_only_steps_waiting_out_a_delay_are_handed_on() -> None:
    entered: list[Step] = []
    _applier(Engine(set(), delay=0.0), entered)(_batch("a"))
    assert entered == []  # entered in the transaction that decided them
    _applier(Engine(set(), delay=2.5), entered)(_batch("a", "b"))
    assert [step.delay for step in entered] == [2.5, 2.5]


def test_in_the_celery_mode_every_step_is_handed_on() -> None:
    entered: list[Step] = []
    engine = Engine(set(), delay=0.0)
    _applier(engine, entered, inline=False)(_batch("a", "b"))
    assert engine.entered_inline is False
    assert len(entered) == 2  # an enter_state task each


def test_a_message_that_cannot_even_be_recorded_is_handed_back_and_the_others_applied() -> None:
    engine, entered = Engine({"b"}, unrecordable=frozenset({"b"})), list[Step]()
    batch = _batch("a", "b", "c")
    assert _applier(engine, entered)(batch) == [batch[1]]
    assert engine.applied == [["a"], ["c"]]
    assert engine.rejected == []


def test_every_try_of_a_batch_and_of_its_split_shares_what_the_failed_tries_sent() -> None:
    engine, entered = Engine({"b"}), list[Step]()
    applier = _applier(engine, entered)
    applier(_batch("a", "b", "c"))
    applier(_batch("d"))
    assert len(engine.memories) == 5 and all(m is applier.sent for m in engine.memories)
