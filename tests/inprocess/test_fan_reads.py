"""What the client reads of fan-outs against real PostgreSQL: a machine's children a page at a
time, the list filtered by parent, a tree that folds a map's many children into counts, and a
fan-out's progress counted from its slots."""

from __future__ import annotations

from uuid import UUID

import pytest

from fsm_celery.client import Client
from fsm_celery.engine import Next
from fsm_celery.exceptions import MachineNotFound
from tests.inprocess.conftest import Fsm, ack

MISSING = "00000000-0000-4000-8000-000000000000"


def _nothing(_: Next) -> None:
    """The client's hand-off, unused: these tests read."""


@pytest.fixture
def client(fsm: Fsm) -> Client:
    return Client(fsm.engine, _nothing)


def _map(fsm: Fsm, items: int) -> tuple[UUID, list[dict[str, object]]]:
    """A map of `items` items, two running (its max_concurrency), the rest waiting."""
    agent = fsm.agent("tester")
    mid = fsm.start("test_fan_map", {"items": [f"i{n}" for n in range(items)], "prefix": "p"})
    return mid, agent.tasks()


def test_a_machines_children_come_a_page_at_a_time_and_the_list_filters_by_parent(
    fsm: Fsm, client: Client
) -> None:
    mid = fsm.start("test_fan_parallel", {})
    fsm.start("test_linear")  # a machine of no fan-out: in no parent's list
    first = client.children(mid, limit=1)
    rest = client.children(mid, limit=10, after=first[0].cursor)
    kids = first + rest
    assert sorted(k.branch or "" for k in kids) == ["docs", "tests"]
    assert {(k.parent_id, k.root_id, k.depth, k.parent_attempt) for k in kids} == {(mid, mid, 1, 1)}
    assert [m.id for m in client.list_machines(parent=str(mid)[:8])] == [k.id for k in kids]
    assert client.children(kids[0].id) == []  # a leaf: no children, and no error
    with pytest.raises(MachineNotFound):
        client.children(MISSING)


def test_a_tree_lists_the_first_children_and_counts_the_others_by_status(
    fsm: Fsm, client: Client
) -> None:
    mid, (first, _) = _map(fsm, 12)
    fsm.receive(ack(first, output={"answer": 1}))  # one done: the third item starts
    tree = client.tree(mid, shown=2)
    assert (tree.type, tree.current_state, tree.status) == ("test_fan_map", "EACH", "running")
    assert [c.branch for c in tree.children] == ["0", "1"]
    assert [c.status for c in tree.children] == ["completed", "running"]
    assert tree.more == {"running": 1, "waiting": 9}
    assert tree.hidden == 10
    assert tree.to_dict()["children"][0]["type"] == "test_fan_map.EACH"


def test_a_tree_goes_down_every_level_within_its_bound(fsm: Fsm, client: Client) -> None:
    root = fsm.start("test_fan_tree", {"left": "L"})
    tree = client.tree(root)
    [child] = tree.children
    [grandchild] = child.children
    assert (child.type, grandchild.type) == ("test_fan_child", "test_pair")
    assert grandchild.status == "running" and grandchild.children == []
    bounded = client.tree(root, most=2)  # the root and one more machine
    assert bounded.children[0].children == []
    assert bounded.children[0].more == {"running": 1}  # its child, counted, not listed
    assert client.tree(grandchild.id).id == grandchild.id  # any machine is a tree's top


def test_a_fan_outs_progress_counts_its_slots(fsm: Fsm, client: Client) -> None:
    mid, (first, second) = _map(fsm, 5)
    fsm.receive(ack(first, output={"answer": 1}), ack(second, success=False, error="no"))
    [progress] = client.fan_outs(mid)
    assert (progress.state, progress.kind, progress.total, progress.verdict) == (
        "EACH",
        "map",
        5,
        "pending",
    )
    assert (progress.done, progress.failed, progress.running, progress.waiting) == (1, 1, 2, 1)
    assert client.fan_outs(fsm.start("test_linear")) == []
    with pytest.raises(MachineNotFound):
        client.fan_outs(MISSING)


def test_an_inline_childs_type_reads_as_its_place_in_its_roots_definition(
    fsm: Fsm, client: Client
) -> None:
    found = client.definition("test_fan_parallel.BUILD.tests")
    assert found.definition.initial_state == "WRITE"
    assert found.type == "test_fan_parallel.BUILD.tests"
