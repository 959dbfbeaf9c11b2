"""The live feed's fan-out: each page gets the events it wants, junk is dropped, and a page that
falls behind is told to resync instead of holding anyone up (no Redis: publish is what the
subscription calls)."""

from __future__ import annotations

import asyncio
import json

import pytest

from fsm_celery.http import hub as hub_module
from fsm_celery.http.hub import QUEUE, RESYNC, EventHub, Interest


def _event(machine: str, to: str = "B") -> str:
    return json.dumps({"type": "state_event", "machineId": machine, "toState": to})


def test_each_listener_gets_what_it_wants_and_junk_reaches_nobody() -> None:
    async def scenario() -> tuple[list[str], list[str]]:
        hub = EventHub("redis://127.0.0.1:1/0", "events")
        one_machine = Interest(machines=frozenset({"m1"}))
        async with hub.listen() as everything, hub.listen(one_machine) as one:
            for raw in [
                _event("m1"),
                _event("m2"),
                "not json",
                json.dumps({"type": "state_task", "machineId": "m1"}),
                json.dumps({"type": "state_event", "machineId": 5}),
                "[" * 10_000,
                json.dumps({"type": "state_event", "machineId": "m1", "pad": "x" * 9000}),
            ]:
                hub.publish(raw)
            return _drain(everything.queue), _drain(one.queue)

    everything, one = asyncio.run(scenario())
    assert everything == [_event("m1"), _event("m2")]
    assert one == [_event("m1")]


def test_a_listener_that_falls_behind_is_told_to_resync() -> None:
    async def scenario() -> list[str]:
        hub = EventHub("redis://127.0.0.1:1/0", "events")
        async with hub.listen() as slow:
            for i in range(QUEUE + 5):
                hub.publish(_event(f"m{i}"))
            assert hub.listeners == 1
            return _drain(slow.queue)

    received = asyncio.run(scenario())
    assert RESYNC in received and len(received) <= QUEUE


def _drain(queue: asyncio.Queue[str]) -> list[str]:
    found = []
    while not queue.empty():
        found.append(queue.get_nowait())
    return found


def _start(machine: str, machine_type: str) -> str:
    return json.dumps(
        {"type": "state_event", "machineId": machine, "event": "start", "machineType": machine_type}
    )


def test_a_page_gets_the_starts_its_filters_show_and_follows_those_machines() -> None:
    async def scenario() -> list[str]:
        hub = EventHub("redis://127.0.0.1:1/0", "events")
        page = Interest(machines=frozenset({"shown"}), starts=True, machine_type="build")
        async with hub.listen(page) as listener:
            for raw in [
                _event("elsewhere"),  # a machine the page does not show
                _event("shown"),
                _start("new", "build"),
                _start("other", "bug"),  # not of the page's type
                _event("new", "C"),  # followed since its start
                _event("other", "C"),
            ]:
                hub.publish(raw)
        assert hub.listeners == 0
        return _drain(listener.queue)

    assert asyncio.run(scenario()) == [_event("shown"), _start("new", "build"), _event("new", "C")]


def test_nobody_listening_costs_no_parsing() -> None:
    hub = EventHub("redis://127.0.0.1:1/0", "events")
    hub.publish(_event("m1"))
    assert hub.received == 0


def test_stopping_never_waits_past_its_bound_for_a_feed_that_hangs_as_it_closes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(hub_module, "STOP_SECONDS", 0.1)

    async def scenario() -> bool:
        hub = EventHub("redis://unused", "events")

        async def hangs_as_it_closes() -> None:  # as redis-py's aclose can (#3941)
            try:
                await asyncio.sleep(3600)
            finally:
                await asyncio.sleep(3600)

        task = hub._task = asyncio.create_task(hangs_as_it_closes())
        await asyncio.sleep(0)
        await hub.stop()
        still_closing = not task.done()  # stop returned without it
        task.cancel()  # let the loop end
        return still_closing

    assert asyncio.run(scenario())


def test_stopping_a_hub_whose_feed_ended_on_another_loop_is_a_no_op() -> None:
    hub = EventHub("redis://unused", "events")

    async def feed_ends() -> None:  # as a second test client's lifespan ends it
        hub.start()
        assert hub._task is not None
        hub._task.cancel()
        await asyncio.wait({hub._task})

    asyncio.run(feed_ends())  # its loop is closed now
    asyncio.run(hub.stop())


def _child(machine: str, parent: str) -> str:
    return json.dumps({"type": "state_event", "machineId": machine, "parentId": parent})


def test_a_machines_page_gets_its_childrens_events_and_no_one_elses() -> None:
    async def scenario() -> list[str]:
        hub = EventHub("redis://127.0.0.1:1/0", "events")
        page = Interest(machines=frozenset({"p"}), parents=frozenset({"p"}))
        async with hub.listen(page) as listener:
            for raw in [_event("p"), _child("c1", "p"), _child("c2", "other"), _event("c3")]:
                hub.publish(raw)
            return _drain(listener.queue)

    assert asyncio.run(scenario()) == [_event("p"), _child("c1", "p")]
