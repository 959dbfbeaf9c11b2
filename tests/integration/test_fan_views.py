"""Fan-out as the API, the command line and the dashboard's pages show it, against a real
database and Redis: a machine's children a page at a time, the list's parent filter, the tree
with a map's many children counted, a fan-out's progress, a child's page naming its parent, a
parallel state drawn as a cluster of its branches. The fan-outs are started by the engine in
the test's process (no worker: the children wait for agents nobody runs)."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from fsm_celery.http import examples
from tests.support.credentials import ADMIN_TOKEN, VIEWER_TOKEN
from tests.support.processes import FsmEnv

FSM_CELERY = str(Path(sys.executable).parent / "fsm-celery")
VIEWER = {"Authorization": f"Bearer {VIEWER_TOKEN}"}
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
MISSING = "00000000-0000-4000-8000-000000000000"


@pytest.fixture(scope="module")
def env(env_factory: Callable[..., FsmEnv]) -> FsmEnv:
    return env_factory("fan_views")


@pytest.fixture(scope="module")
def http(env: FsmEnv) -> Iterator[Any]:
    with env.api() as client:
        yield client


def start(env: FsmEnv, machine_type: str, context: dict[str, Any] | None = None) -> UUID:
    """Start a machine and enter its first state, and its children's, as the worker would."""
    engine = env.client.engine
    [first] = engine.admin.start(machine_type, context).next
    steps = engine.entry.enter(first.machine_id, first.attempt)
    while steps:
        steps = [s for step in steps for s in engine.entry.enter(step.machine_id, step.attempt)]
    return first.machine_id


@pytest.fixture(scope="module")
def mapped(env: FsmEnv) -> UUID:
    """A map of 12 items: its first child cancelled by an operator, so the third started; two
    running, nine waiting their turn."""
    mid = start(env, "test_fan_map", {"items": list(range(12)), "prefix": "p"})
    first = next(c for c in env.client.children(mid) if c.branch == "0")
    env.client.cancel(first.id, "carol", "not needed")
    return mid


@pytest.fixture(scope="module")
def parallel(env: FsmEnv) -> UUID:
    return start(env, "test_fan_parallel", {"repo": "sla"})


def cli(env: FsmEnv, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [FSM_CELERY, *args], env=env.env, capture_output=True, text=True, timeout=60
    )


# -- the HTTP API ------------------------------------------------------------------------------


def test_a_machines_children_come_a_page_at_a_time(http: Any, mapped: UUID) -> None:
    first = http.get(f"/api/machines/{mapped}/children", params={"limit": 2}, headers=VIEWER)
    assert first.status_code == 200, first.text
    page = first.json()
    assert len(page["items"]) == 2 and page["next"]
    rest = http.get(
        f"/api/machines/{mapped}/children",
        params={"limit": 2, "cursor": page["next"]},
        headers=VIEWER,
    ).json()
    children = page["items"] + rest["items"]
    assert rest["next"] is None
    assert sorted(c["branch"] for c in children) == ["0", "1", "2"]
    assert {(c["parent_id"], c["root_id"], c["depth"]) for c in children} == {
        (str(mapped), str(mapped), 1)
    }
    assert children[0].keys() == examples.CHILD.keys()
    listed = http.get("/api/machines", params={"parent": str(mapped)}, headers=VIEWER).json()
    assert [c["id"] for c in listed["items"]] == [c["id"] for c in children]
    by_type = http.get("/api/machines", params={"type": "test_fan_map.EACH"}, headers=VIEWER)
    assert {c["id"] for c in by_type.json()["items"]} == {c["id"] for c in children}


def test_the_tree_lists_the_first_children_and_counts_the_rest(http: Any, mapped: UUID) -> None:
    found = http.get(f"/api/machines/{mapped}/tree", params={"shown": 1}, headers=VIEWER)
    assert found.status_code == 200, found.text
    tree = found.json()["tree"]
    assert tree.keys() == examples.TREE.keys()
    assert [(c["branch"], c["status"]) for c in tree["children"]] == [("0", "cancelled")]
    assert tree["more"] == {"running": 2, "waiting": 9}


def test_a_fan_outs_progress_is_counted_from_its_slots(http: Any, mapped: UUID) -> None:
    [progress] = http.get(f"/api/machines/{mapped}/fan-outs", headers=VIEWER).json()["items"]
    assert progress.keys() == examples.FAN_OUT.keys()
    counts = {k: progress[k] for k in ("done", "failed", "running", "waiting", "cancelled")}
    assert counts == {"done": 0, "failed": 0, "running": 2, "waiting": 9, "cancelled": 1}
    assert (progress["state"], progress["kind"], progress["total"]) == ("EACH", "map", 12)


@pytest.mark.parametrize("path", ["children", "tree", "fan-outs"])
def test_an_unknown_machine_is_a_404(http: Any, path: str) -> None:
    response = http.get(f"/api/machines/{MISSING}/{path}", headers=VIEWER)
    assert response.status_code == 404, response.text
    assert MISSING in response.json()["error"]["message"]


def test_a_parent_filter_that_is_not_an_id_is_a_422_naming_it(http: Any) -> None:
    response = http.get("/api/machines", params={"parent": "nope"}, headers=VIEWER)
    assert response.status_code == 422 and "parent" in response.json()["error"]["message"]


# -- the command line ---------------------------------------------------------------------------


def test_tree_prints_each_machine_with_its_type_state_and_status(env: FsmEnv, mapped: UUID) -> None:
    done = cli(env, "tree", str(mapped), "--shown", "2")
    assert done.returncode == 0 and done.stderr == "", done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == [str(mapped)[:8], "test_fan_map", "EACH", "running"]
    assert re.fullmatch(r"├── \[0\] \w{8}  test_fan_map\.EACH  WORK  cancelled", lines[1])
    assert re.fullmatch(r"├── \[1\] \w{8}  test_fan_map\.EACH  WORK  running", lines[2])
    assert lines[3] == "└── … 10 more: 1 running, 9 waiting"
    assert len(lines) == 4
    as_json = json.loads(cli(env, "tree", str(mapped), "--shown", "2", "--json").stdout)
    assert as_json.keys() == examples.TREE.keys()
    assert as_json["more"] == {"running": 1, "waiting": 9}


def test_tree_goes_down_every_level(env: FsmEnv) -> None:
    root = start(env, "test_fan_tree", {"left": "L"})
    lines = cli(env, "tree", str(root)[:8]).stdout.splitlines()
    assert [line.split()[-3:-2] for line in lines] == [
        ["test_fan_tree"],
        ["test_fan_child"],
        ["test_pair"],
    ]
    assert lines[1].startswith("└── ") and lines[2].startswith("    └── ")


def test_status_names_a_childs_parent_and_list_takes_a_parent(env: FsmEnv, parallel: UUID) -> None:
    child = env.client.children(parallel)[0]
    shown = cli(env, "status", str(child.id)).stdout
    assert f"parent_id      {parallel}" in shown
    assert f"branch         {child.branch}" in shown
    listed = cli(env, "list", "--parent", str(parallel)[:8]).stdout.splitlines()
    assert len(listed) == 3 and "test_fan_parallel.BUILD." in listed[1]
    by_type = cli(env, "list", "--type", child.type).stdout.splitlines()
    assert [line.split()[0] for line in by_type[1:]] == [str(child.id)]
    history = cli(env, "history", str(child.id)).stdout
    assert f"started by {parallel} in BUILD, slot {child.branch}" in history


def test_tree_of_an_unknown_machine_is_one_line(env: FsmEnv) -> None:
    done = cli(env, "tree", MISSING)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip() == f"error: no machine with id '{MISSING}'"


# -- the dashboard's pages ----------------------------------------------------------------------


def drawing(page: str) -> dict[str, Any]:
    found = re.search(r'data-drawing="([^"]*)"', page)
    assert found is not None
    data: dict[str, Any] = json.loads(html.unescape(found.group(1)))
    return data


def test_a_parents_page_lists_its_children_and_draws_its_branches(
    http: Any, env: FsmEnv, parallel: UUID
) -> None:
    response = http.get(f"/machines/{parallel}", headers=ADMIN)
    assert response.status_code == 200, response.text
    page = response.text
    for child in env.client.children(parallel):
        assert f'<tr data-machine="{child.id}">' in page
        assert f"test_fan_parallel.BUILD.{child.branch}" in page
    graph = drawing(page)
    assert [b["name"] for b in graph["graph"]["branches"]["BUILD"]] == ["tests", "docs"]
    assert {(c["branch"], c["current_state"]) for c in graph["children"]} == {
        ("tests", "WRITE"),
        ("docs", "WRITE"),
    }


def test_a_maps_page_shows_its_progress(http: Any, mapped: UUID) -> None:
    page = http.get(f"/machines/{mapped}", headers=ADMIN).text
    progress = drawing(page)["fanOuts"]["EACH"]
    assert (progress["running"], progress["waiting"], progress["cancelled"]) == (2, 9, 1)
    assert '<td class="waiting">9</td>' in page
    assert "… 9 more: 9 waiting" in page  # the items not started yet: slots, not machines


def test_a_childs_page_links_its_parent(http: Any, env: FsmEnv, parallel: UUID) -> None:
    child = env.client.children(parallel)[0]
    response = http.get(f"/machines/{child.id}", headers=ADMIN)
    assert response.status_code == 200, response.text
    assert f'<a class="mono" href="/machines/{parallel}">{str(parallel)[:8]}</a>' in response.text
    assert drawing(response.text)["graph"]["nodes"][0]["id"] == "WRITE"


def test_the_machines_list_filtered_by_parent_shows_its_children_only(
    http: Any, env: FsmEnv, parallel: UUID
) -> None:
    page = http.get("/", params={"parent": str(parallel)}, headers=ADMIN).text
    shown = set(re.findall(r'<tr data-machine="([0-9a-f-]+)"', page))
    assert shown == {str(c.id) for c in env.client.children(parallel)}
    assert f'<input type="hidden" name="parent" value="{parallel}">' in page
