"""The stream consumer's pure parts: what an ack stream's name says, what a claim returns."""

from __future__ import annotations

import uuid

from fsm_celery.acks.streams import _agent_of, claimed_ids, clip
from fsm_celery.acks.wakeup import missing_flags


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
