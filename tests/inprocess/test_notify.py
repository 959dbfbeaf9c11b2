"""Notifications when machines end: written with the ending transition, sent afterwards to a real
HTTP receiver on 127.0.0.1, signed, retried with backoff, failed for good with the receiver's
answer, and never in a transition's way."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from sqlalchemy import select

from fsm_celery import wiring
from fsm_celery.core.admin import Action, Command
from fsm_celery.core.loader import parse_definition
from fsm_celery.engine import MachineEngine
from fsm_celery.store.tables import notifications
from tests.inprocess.conftest import Fsm, ack, inline_inbox
from tests.support.receiver import Receiver

SECRET = "notify-secret"


def _engine(fsm: Fsm, **settings: Any) -> MachineEngine:
    """An engine on the test's database and clock with notification settings of its own."""
    changed = fsm.settings.model_copy(update={"notify_secret": SECRET, **settings})
    return wiring.machine_engine(changed, clock=fsm.clock)


def _load(engine: MachineEngine, notify: dict[str, Any] | None) -> None:
    body: dict[str, Any] = {
        "type": "notified",
        "agent_type": "tester",
        "initial_state": "WORK",
        "states": [
            {"name": "WORK", "on_success": "DONE", "on_failure": "FAILED"},
            {"name": "DONE", "terminal": "completed"},
            {"name": "FAILED", "terminal": "failed"},
        ],
    }
    if notify is not None:
        body["notify"] = notify
    engine.catalog.load([parse_definition(body)])


def _finish(fsm: Fsm, engine: MachineEngine, context: dict[str, Any] | None = None) -> Any:
    [first] = engine.admin.start("notified", context or {"deploymentUrl": "https://x.test"}).next
    engine.entry.enter(first.machine_id, first.attempt)
    task = fsm.agent("tester").tasks()[-1]
    inline_inbox(engine).apply([_inbound(ack(task))])
    return first.machine_id


def _inbound(message: dict[str, Any]) -> Any:
    from fsm_celery.engine import Inbound

    return Inbound(json.dumps(message), None)


def _rows(engine: MachineEngine) -> list[Any]:
    with engine.db.connect() as conn:
        return list(conn.execute(select(notifications).order_by(notifications.c.id)).all())


def test_a_machine_that_ends_notifies_once_signed_with_its_context(
    fsm: Fsm, receiver: Receiver
) -> None:
    engine = _engine(fsm)
    _load(engine, {"url": receiver.url})
    mid = _finish(fsm, engine)
    assert receiver.received == []  # nothing is sent inside the transition
    assert engine.notifier.send_due() == (1, 0)
    assert engine.notifier.send_due() == (0, 0)  # once

    [(headers, body)] = receiver.received
    expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    assert headers["x-fsm-signature-256"] == expected
    assert headers["x-fsm-event"] == "machine.completed"
    message = json.loads(body)
    assert (message["machineId"], message["status"], message["state"]) == (
        str(mid),
        "completed",
        "DONE",
    )
    assert message["context"]["deploymentUrl"] == "https://x.test"
    [row] = _rows(engine)
    assert (row.status, row.attempts, row.last_error) == ("delivered", 1, None)


def test_a_failing_receiver_is_tried_again_later_then_given_up_on(
    fsm: Fsm, receiver: Receiver
) -> None:
    engine = _engine(fsm, notify_url=receiver.url, notify_max_attempts=3)
    _load(engine, None)  # the global URL only
    receiver.answers = [500, 503, 502]
    _finish(fsm, engine)
    assert engine.notifier.send_due() == (0, 1)
    assert engine.notifier.send_due() == (0, 0)  # not before its backoff
    [row] = _rows(engine)
    assert (row.status, row.last_error) == ("pending", "HTTP 500: nope")
    for _ in range(2):
        fsm.clock.advance(3600)
        assert engine.notifier.send_due() == (0, 1)
    [row] = _rows(engine)
    assert (row.status, row.attempts, row.last_error) == ("failed", 3, "HTTP 502: nope")
    [shown] = wiring.client(engine.settings, engine).notifications(row.machine_id, admin=True)
    assert (shown["status"], shown["attempts"], shown["url"]) == ("failed", 3, receiver.url)
    assert len(receiver.received) == 3
    fsm.clock.advance(86_400)
    assert engine.notifier.send_due() == (0, 0)  # failed for good


def test_a_receiver_that_is_down_holds_no_transition_back(fsm: Fsm, receiver: Receiver) -> None:
    engine = _engine(fsm, notify_url="http://127.0.0.1:1/hook")
    _load(engine, None)
    mid = _finish(fsm, engine)
    assert fsm.machine(mid).status == "completed"
    assert engine.notifier.send_due() == (0, 1)
    [row] = _rows(engine)
    assert row.status == "pending" and row.last_error.startswith("ConnectError")


def test_a_definition_notifies_only_the_endings_it_names(fsm: Fsm, receiver: Receiver) -> None:
    engine = _engine(fsm)
    _load(engine, {"url": receiver.url, "on": ["failed", "cancelled"]})
    _finish(fsm, engine)  # completed: not named
    [second] = engine.admin.start("notified", {}).next
    engine.admin.command(second.machine_id, Command(Action.CANCEL, "ops", "not needed"))
    assert engine.notifier.send_due() == (1, 0)
    [(headers, body)] = receiver.received
    assert headers["x-fsm-event"] == "machine.cancelled"
    assert json.loads(body)["machineId"] == str(second.machine_id)


def test_without_a_secret_nothing_is_sent_unsigned(fsm: Fsm, receiver: Receiver) -> None:
    engine = _engine(fsm, notify_secret="", notify_url=receiver.url)
    _load(engine, None)
    _finish(fsm, engine)
    assert engine.notifier.send_due() == (0, 1)
    assert receiver.received == []
    assert "FSM_NOTIFY_SECRET is not set" in _rows(engine)[0].last_error
