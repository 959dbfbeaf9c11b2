"""The bridge's pure parts: its reconnect delay, and what an ack stream's name says."""

from __future__ import annotations

import uuid

from fsm_celery.channel.bridge import Backoff, _agent_of, claimed_ids, clip
from fsm_celery.channel.wakeup import missing_flags


def test_the_reconnect_delay_doubles_up_to_its_cap() -> None:
    backoff = Backoff(first=0.1, cap=1.0)
    assert [backoff.next() for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]


def test_the_reconnect_delay_starts_again_once_reset() -> None:
    backoff = Backoff(first=0.1, cap=5.0)
    for _ in range(5):
        backoff.next()
    backoff.reset()
    assert backoff.next() == 0.1


def test_an_agents_own_ack_stream_names_the_agent() -> None:
    agent = uuid.uuid4()
    assert _agent_of(f"p:stream:state:ack:{agent}", "p:") == agent


def test_the_shared_stream_and_foreign_keys_name_no_agent() -> None:
    assert _agent_of("p:stream:state:ack", "p:") is None
    assert _agent_of("p:stream:state:ack:not-a-uuid", "p:") is None
    assert _agent_of(f"q:stream:state:ack:{uuid.uuid4()}", "p:") is None


def test_a_payload_is_cut_just_past_the_limit() -> None:
    assert clip(b"x" * 50, 10) == "x" * 11
    assert clip("short", 10) == "short"


def test_claimed_ids_read_from_either_shape_of_reply() -> None:
    # redis-py 8 parses XAUTOCLAIM ... JUSTID down to the ids; earlier versions did not
    assert claimed_ids([b"1-0"]) == [b"1-0"]
    assert claimed_ids([b"1-0", b"2-0"]) == [b"1-0", b"2-0"]
    assert claimed_ids([b"0-0", [b"1-0"], []]) == [b"1-0"]
    assert claimed_ids([b"0-0", [], []]) == []
    assert claimed_ids([]) == []
    assert claimed_ids(ConnectionError("gone")) == []


def test_the_wakeup_adds_only_the_notification_flags_it_lacks() -> None:
    assert missing_flags("") == "Kt"
    assert missing_flags("Ex") == "Kt"
    assert missing_flags("KA") == ""  # A includes t
    assert missing_flags("tK") == ""
