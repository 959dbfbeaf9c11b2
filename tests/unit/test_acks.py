"""The acks side's logic, without I/O: the Applier's isolation of a message that breaks its
batch, the bridge's loop over a real in-memory consumer (finish, try again, park), the one
dead-letter policy, and the relay's wire format."""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable

import kombu.exceptions
import pytest
import redis

from fsm_celery.acks.bridge import Bridge, Handled, Reconnect, applied_here, handle_until_done
from fsm_celery.acks.consumer import Envelope
from fsm_celery.acks.memory import MemoryConsumer
from fsm_celery.acks.relay import ACKS_SHOWN, acks_repr, chunks, wire
from fsm_celery.channel.transient import TRANSIENT
from fsm_celery.core.parking import CRASH_DELIVERIES, Policy, reason
from fsm_celery.core.transition import RejectReason
from fsm_celery.engine import Inbound, Next, Step
from fsm_celery.engine.inbox import Applier
from fsm_celery.worker.tasks import unwire


class Inbox:
    """The engine's operation and its rejection: applies a batch unless it holds a poisoned
    message (as the database refuses a NUL), deciding a step per message."""

    def __init__(
        self, poisoned: frozenset[str] = frozenset(), unrecordable: frozenset[str] = frozenset()
    ) -> None:
        self.poisoned, self.unrecordable = poisoned, unrecordable
        self.applied: list[list[str]] = []
        self.rejected: list[tuple[str, RejectReason, str]] = []
        self.error: Exception | None = None

    def apply(self, batch: list[Inbound]) -> Next:
        if self.error is not None:
            raise self.error
        payloads = [item.raw for item in batch]
        if self.poisoned & set(payloads):
            raise ValueError("unsupported Unicode escape sequence\nDETAIL: more")
        self.applied.append(payloads)
        return [Step(uuid.uuid5(uuid.NAMESPACE_OID, p), 2) for p in payloads]

    def reject(self, raw: str, reason: RejectReason, detail: str) -> None:
        if raw in self.unrecordable:
            raise ValueError("integer out of range")
        self.rejected.append((raw, reason, detail))


def _envelopes(*payloads: str, tries: int = 1) -> list[Envelope]:
    return [Envelope(Inbound(p), "s", tries) for p in payloads]


def _applier(inbox: Inbox, handed: list[Step]) -> Applier[Envelope]:
    return Applier(inbox.apply, inbox.reject, handed.extend, TRANSIENT)


def test_a_healthy_batch_is_applied_in_one_transaction_and_its_next_states_handed_on() -> None:
    inbox, handed = Inbox(), list[Step]()
    assert _applier(inbox, handed)(_envelopes("a", "b", "c")) == []
    assert inbox.applied == [["a", "b", "c"]] and inbox.rejected == []
    assert [s.machine_id for s in handed] == [uuid.uuid5(uuid.NAMESPACE_OID, p) for p in "abc"]


def test_a_message_that_breaks_its_batch_is_rejected_and_the_others_applied() -> None:
    inbox, handed = Inbox(frozenset({"b"})), list[Step]()
    assert _applier(inbox, handed)(_envelopes("a", "b", "c")) == []
    assert inbox.applied == [["a"], ["c"]]
    assert inbox.rejected == [
        ("b", RejectReason.UNPROCESSABLE, "ValueError: unsupported Unicode escape sequence")
    ]
    assert len(handed) == 2  # the messages applied hand their states on; the rejected none


@pytest.mark.parametrize("error", [redis.ConnectionError("gone"), redis.TimeoutError("slow")])
def test_a_transient_error_is_raised_whole_and_nothing_is_rejected(error: Exception) -> None:
    inbox, handed = Inbox(), list[Step]()
    inbox.error = error
    with pytest.raises(type(error)):
        _applier(inbox, handed)(_envelopes("a", "b"))
    assert inbox.rejected == [] and handed == []


def test_a_committed_batch_whose_states_cannot_be_handed_on_says_so_and_is_done(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Redis failed over after the commit: the batch is not tried again (nor rejected by Celery
    with a bare `Error 111`); the log line says it was applied and the scan enters its states."""
    inbox = Inbox()

    def unreachable(_: Next) -> None:
        raise kombu.exceptions.OperationalError("Error 111 connecting to 127.0.0.1:6379.")

    with caplog.at_level(logging.WARNING, logger="fsm_celery.engine.inbox"):
        assert (
            Applier(inbox.apply, inbox.reject, unreachable, TRANSIENT)(_envelopes("a", "b")) == []
        )
    assert inbox.applied == [["a", "b"]] and inbox.rejected == []
    [line] = [r.getMessage() for r in caplog.records]
    assert line == (
        "applied and committed 2 messages; the 2 states they moved machines to could not be "
        "handed on (OperationalError: Error 111 connecting to 127.0.0.1:6379.): nothing is "
        "lost, the scan enters each when it is due"
    )


def test_a_message_that_cannot_even_be_recorded_is_returned_and_the_others_applied() -> None:
    inbox = Inbox(frozenset({"b"}), unrecordable=frozenset({"b"}))
    batch = _envelopes("a", "b", "c")
    assert _applier(inbox, [])(batch) == [batch[1]]
    assert inbox.applied == [["a"], ["c"]] and inbox.rejected == []


def _serve(
    consumer: MemoryConsumer, inbox: Inbox, policy: Policy, until: Callable[[], bool]
) -> None:
    """Run the bridge's loop over the consumer until the condition holds."""
    bridge = Bridge([consumer], applied_here(_applier(inbox, [])), policy)
    stop = threading.Event()
    thread = threading.Thread(target=bridge.run, args=(stop,), daemon=True)
    thread.start()
    try:
        for _ in range(250):
            if until():
                return
            stop.wait(0.02)
        raise AssertionError("the bridge did not get there")
    finally:
        stop.set()
        thread.join(5)


def test_the_bridge_finishes_what_was_applied_or_recorded() -> None:
    consumer, inbox = MemoryConsumer(), Inbox(frozenset({"bad"}))
    for payload in ("a", "bad", "c"):
        consumer.put(payload)
    _serve(consumer, inbox, Policy(3), lambda: len(consumer.finished) == 3)
    assert sorted(d.item.raw for d in consumer.finished) == ["a", "bad", "c"]
    assert [r[0] for r in inbox.rejected] == ["bad"] and consumer.parked == []


def test_a_message_neither_applied_nor_recorded_is_tried_again_then_parked() -> None:
    consumer = MemoryConsumer()
    inbox = Inbox(frozenset({"bad"}), unrecordable=frozenset({"bad"}))
    consumer.put("bad")
    consumer.put("fine")
    _serve(consumer, inbox, Policy(3), lambda: bool(consumer.parked))
    [(parked, why)] = consumer.parked
    assert parked.item.raw == "bad" and parked.tries == 3  # handed out three times
    assert why == "could not be applied nor recorded 3 times"
    assert [d.item.raw for d in consumer.finished] == ["fine"]


def test_a_consumer_that_cannot_hand_a_message_out_again_parks_it_at_once() -> None:
    consumer = MemoryConsumer()
    consumer.redelivers = False  # as pub/sub
    inbox = Inbox(frozenset({"bad"}), unrecordable=frozenset({"bad"}))
    consumer.put("bad")
    _serve(consumer, inbox, Policy(3), lambda: bool(consumer.parked))
    assert consumer.parked[0][1] == "could not be applied nor recorded 1 time"


def test_a_message_in_hand_each_time_its_reader_died_is_parked_before_it_is_tried() -> None:
    consumer, inbox = MemoryConsumer(), Inbox()
    consumer.put("x")
    consumer.retry([d._replace(tries=CRASH_DELIVERIES) for d in consumer.read(threading.Event())])
    _serve(consumer, inbox, Policy(3), lambda: bool(consumer.parked))
    assert consumer.parked[0][1] == Policy.CRASHED and inbox.applied == []


def test_the_policy_gives_up_by_tries() -> None:
    policy = Policy(3)
    failed = [*_envelopes("a", tries=2), *_envelopes("b", tries=3)]
    assert [d.item.raw for d in policy.give_up(failed)] == ["b"]
    assert [d.item.raw for d in policy.give_up(failed, redelivers=False)] == ["a", "b"]
    assert reason(failed[0]) == "could not be applied nor recorded 2 times"


def test_a_batch_in_hand_is_handled_again_while_the_database_is_away() -> None:
    calls: list[int] = []

    def handle(batch: list[Envelope]) -> Handled:
        calls.append(len(batch))
        if len(calls) < 3:
            raise redis.ConnectionError("away")
        return Handled([], [])

    assert handle_until_done(handle, _envelopes("a"), threading.Event()) == ([], [])
    assert calls == [1, 1, 1]


def test_the_reconnect_delay_doubles_up_to_its_cap_and_starts_again_once_reset() -> None:
    delay = Reconnect(first=0.1, cap=1.0)
    assert [delay.next() for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    delay.reset()
    assert delay.next() == 0.1


def _ack(machine: str, state: str = "S0", attempt: int = 1) -> Envelope:
    raw = {"type": "state_ack", "machineId": machine, "state": state, "attempt": attempt}
    return Envelope(Inbound(json.dumps(raw)), "stream:state:ack")


def test_the_relay_carries_each_message_with_its_sender_source_entry_and_tries() -> None:
    agent = uuid.uuid4()
    stream = f"stream:state:ack:{agent}"
    batch = [Envelope(Inbound("m1", agent, 17.5), stream, 4, b"1-2"), _ack("x")]
    carried = unwire(json.loads(json.dumps(wire(batch))), tries=9)
    assert carried == [batch[0]._replace(key="1-2"), batch[1]]
    relayed = unwire(json.loads(json.dumps(wire(batch, tries=1))), tries=9)
    assert [d.tries for d in relayed] == [1, 1]  # a relay is a copy's first try


def test_a_task_sent_by_an_earlier_version_is_still_applied() -> None:
    assert unwire([["m", None]], tries=1) == [Envelope(Inbound("m"), "relayed", 1)]
    old = unwire([["m", None, "s", 3.0]], tries=2)  # no entry: the bridge settled it
    assert old == [Envelope(Inbound("m", None, 3.0), "s", 2, None)]


def test_a_batch_is_split_by_bytes_and_a_message_over_the_limit_travels_alone() -> None:
    small, big = Envelope(Inbound("x" * 10), "s"), Envelope(Inbound("y" * 100), "s")
    assert chunks([small, small, big, small], 25) == [[small, small], [big], [small]]
    assert chunks([], 25) == []


def test_an_apply_acks_task_names_its_machines_states_and_attempts() -> None:
    machine = str(uuid.uuid4())
    shown = acks_repr([_ack(machine, "BUILD", 3), Envelope(Inbound("{not json"), "s")])
    assert shown == f"2 messages: state_ack {machine} state=BUILD attempt=3, (not JSON)"


def test_an_apply_acks_task_names_at_most_its_first_machines() -> None:
    batch = [_ack(str(uuid.uuid4())) for _ in range(ACKS_SHOWN + 5)]
    shown = acks_repr(batch)
    assert shown.endswith(", and 5 more")
    assert str(json.loads(batch[ACKS_SHOWN - 1].item.raw)["machineId"]) in shown
    assert str(json.loads(batch[ACKS_SHOWN].item.raw)["machineId"]) not in shown


def test_hostile_fields_are_cut_in_what_flower_shows() -> None:
    hostile = json.dumps({"type": "x" * 1000, "machineId": "m" * 1000})
    assert len(acks_repr([Envelope(Inbound(hostile), "s")])) < 200
