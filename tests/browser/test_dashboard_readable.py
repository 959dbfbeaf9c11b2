"""What the dashboard shows can be read, in a real browser against a real deployment (see
tests/browser/browser.py): every control's text stands out from what it is drawn on (WCAG's
4.5:1, computed in the page from computed styles); the graph's edges stay inside its panel; a
finished machine shows no deadline; a definition's states table names approval and wait edges;
the machines list shows the machines people started (children on their parent's page, or all
of them on asking).
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

from playwright.sync_api import Page, expect

from tests.browser.browser import (
    ARTIFACTS,
    FIX_BUG_CONTEXT,
    WAIT_MS,
    Dashboard,
    low_contrast,
    sign_in,
    wait_live,
    waiting_machine,
)
from tests.support.agents import ScriptedAgent
from tests.support.credentials import ADMIN_TOKEN
from tests.support.processes import FsmEnv


def _children(env: FsmEnv, parent: uuid.UUID, count: int) -> list[Any]:
    """The parent's children, once the worker has started `count` of them."""
    deadline = time.monotonic() + WAIT_MS / 1000
    while len(found := env.client.children(parent)) < count:
        assert time.monotonic() < deadline, f"{len(found)} of {count} children started"
        time.sleep(0.1)
    return found


def test_every_control_on_every_page_stands_out_from_its_background(
    dashboard: Dashboard, page: Page
) -> None:
    env = dashboard.env
    waiting = waiting_machine(env)
    with ScriptedAgent(env) as agent:  # BUILD answered: the machine waits at its gate's form
        gate = env.client.start_machine("test_gate", {}, agent_id=agent.id)
        env.wait_for_gate(gate, "REVIEW")
    done = env.client.start_machine("cto_fix_bug", FIX_BUG_CONTEXT)
    assert env.wait_until_done(done).status == "completed"
    page.goto(dashboard.at("/login"))
    found = {"/login": low_contrast(page)}
    sign_in(page, dashboard, ADMIN_TOKEN, "Ada")
    paths = ["/", "/approvals", "/definitions", "/machines/x"]
    paths += [f"/machines/{m}" for m in (waiting, gate, done)]
    paths += [f"/definitions/{t}" for t in env.client.machine_types()]
    for path in paths:
        page.goto(dashboard.at(path))
        if path == "/" or (path.startswith("/machines/") and path != "/machines/x"):
            wait_live(page)
        if path.startswith("/definitions/"):
            expect(page.locator("#graph g.node").first).to_be_visible()
        found[path] = low_contrast(page)
    page.goto(dashboard.at(f"/machines/{gate}"))
    expect(page.locator("form#decision button#reject")).to_be_visible()
    assert low_contrast(page) == [], "the gate's form"
    page.goto(dashboard.at(f"/machines/{waiting}"))  # the timeline's rewind and fork, a dialog
    expect(page.locator("#timeline button[data-travel=rewind]")).to_have_count(1)
    page.locator("#actions button[data-action=force]").click()
    expect(page.locator("dialog#confirm")).to_be_visible()
    found["the force dialog"] = low_contrast(page)
    unreadable = {where: low for where, low in found.items() if low}
    assert not unreadable, unreadable


def test_a_machine_shows_its_deadline_only_while_it_runs(dashboard: Dashboard, page: Page) -> None:
    env = dashboard.env
    mid = env.client.start_machine("cto_fix_bug", FIX_BUG_CONTEXT)
    sign_in(page, dashboard, ADMIN_TOKEN, "Ada", then=f"/machines/{mid}")
    wait_live(page)
    deadline = page.locator(".facts div", has=page.locator("dt", has_text="deadline")).locator("dd")
    expect(page.locator("#m-status")).to_have_text("completed", timeout=WAIT_MS)
    expect(deadline).to_have_text("—")  # live: the last state's deadline is gone
    page.reload()
    expect(deadline).to_have_text("—")

    waiting = waiting_machine(env)
    page.goto(dashboard.at(f"/machines/{waiting}"))
    running = env.client.get_machine(waiting).deadline_at
    assert running is not None
    expect(deadline).to_have_text(running.strftime("%Y-%m-%d %H:%M:%S"))
    env.client.pause(waiting, "ops", "a look at its page (browser test)")
    expect(deadline).to_have_text("none while paused", timeout=WAIT_MS)


def test_a_definitions_states_table_names_every_way_out_of_each_state(
    dashboard: Dashboard, page: Page
) -> None:
    """An approval's and a wait's edges too: their verdicts, events and deadline."""
    env = dashboard.env
    sign_in(page, dashboard, ADMIN_TOKEN, "Ada", then="/definitions")
    missing = []
    for machine_type in env.client.machine_types():
        page.goto(dashboard.at(f"/definitions/{machine_type}"))
        for state in env.client.definition(machine_type).definition.states:
            row = page.locator(f'table#states tr[data-state="{state.name}"]')
            cells = row.locator("td").nth(4).inner_text() + row.locator("td").nth(5).inner_text()
            targets = {e.target for e in state.edges}
            missing += [f"{machine_type} {state.name} → {t}" for t in targets if t not in cells]
    assert not missing, missing

    page.goto(dashboard.at("/definitions/test_gate"))
    review = page.locator('table#states tr[data-state="REVIEW"]')
    expect(review.locator(".on-success div")).to_have_text(
        ["approved: SHIP_PROD if output.target == 'production'", "approved: SHIP"]
    )
    expect(review.locator(".on-failure div")).to_have_text(
        ["rejected: BUILD (loop)", "no decision in 1 h: ESCALATE"]
    )
    escalate = page.locator('table#states tr[data-state="ESCALATE"]')
    expect(escalate.locator(".on-failure div")).to_have_text(
        ["rejected: FAILED", "no decision in 10 min: rejected"]
    )
    page.goto(dashboard.at("/definitions/test_wait"))
    waits = page.locator('table#states tr[data-state="WAIT_MERGE"]')
    expect(waits.locator(".on-success div")).to_have_text(
        ["pr_merged: DEPLOY if output.merged", "pr_merged: BUILD (loop)"]
    )
    expect(waits.locator(".on-failure div")).to_have_text(["no event in 1 h: FAILED"])


def test_the_machines_list_shows_roots_and_a_parent_shows_its_children(
    dashboard: Dashboard, page: Page
) -> None:
    """A fan-out's children are on their parent's page, not in the list (unless asked for):
    neither those there when the list loads nor those that start while it is open."""
    env = dashboard.env
    before = env.client.start_machine("test_fan_map", {"items": list(range(3)), "prefix": "p"})
    started = _children(env, before, 2)
    sign_in(page, dashboard, ADMIN_TOKEN, "Ada")
    wait_live(page)
    rows = page.locator("table#machines tr[data-machine]")
    expect(page.locator(f'table#machines tr[data-machine="{before}"]')).to_have_count(1)
    after = env.client.start_machine("test_fan_map", {"items": list(range(3)), "prefix": "q"})
    expect(page.locator(f'table#machines tr[data-machine="{after}"]')).to_have_count(1)
    started += _children(env, after, 2)
    env.client.cancel(started[0].id, "ops", "the next item starts (browser test)")
    page.wait_for_timeout(1500)  # long enough for a child's start to have reached the page
    listed = set(rows.evaluate_all("rows => rows.map(r => r.dataset.machine)"))
    children = {str(c.id) for c in env.client.children(before) + env.client.children(after)}
    assert listed & children == set()
    page.reload()
    listed = set(rows.evaluate_all("rows => rows.map(r => r.dataset.machine)"))
    assert {str(before), str(after)} <= listed
    assert listed & children == set()

    api = page.request.get(dashboard.at("/api/machines?roots=true&limit=500")).json()["items"]
    assert {m["parent_id"] for m in api} == {None} and {str(before), str(after)} <= {
        m["id"] for m in api
    }
    counted = page.request.get(dashboard.at("/api/machines/count?roots=true&type=test_fan_map"))
    assert counted.json()["total"] == 2

    page.check("#filters input[name=children]")
    page.click("#filters button[type=submit]")
    expect(page).to_have_url(re.compile(r"[?&]children=true"))
    for child in children:
        expect(page.locator(f'table#machines tr[data-machine="{child}"]')).to_have_count(1)

    page.goto(dashboard.at(f"/machines/{after}"))
    expect(page.locator("#children tr[data-machine]")).to_have_count(
        len(env.client.children(after))
    )
    page.click("text=every child →")
    for child in env.client.children(after):
        expect(page.locator(f'table#machines tr[data-machine="{child.id}"]')).to_have_count(1)


# The parts of #graph's drawing (edges, their labels, nodes, clusters) that reach past the
# drawing's own box, where the page cuts them off, by how many pixels.
OUTSIDE = """
() => {
  const svg = document.querySelector("#graph svg");
  const box = svg.getBoundingClientRect();
  const out = [];
  for (const part of svg.querySelectorAll("g.edge path, text, g.node rect, g.cluster rect")) {
    const r = part.getBoundingClientRect();
    const past = Math.max(box.left - r.left, r.right - box.right, box.top - r.top,
      r.bottom - box.bottom);
    if (past > 0.5) out.push(`${part.closest("g").getAttribute("class")}: ${past.toFixed(1)} px`);
  }
  return out;
}
"""


def test_the_graph_draws_every_edge_inside_its_panel(dashboard: Dashboard, page: Page) -> None:
    env = dashboard.env
    sign_in(page, dashboard, ADMIN_TOKEN, "Ada", then="/definitions")
    clipped = {}
    for machine_type in env.client.machine_types():
        page.goto(dashboard.at(f"/definitions/{machine_type}"))
        expect(page.locator("#graph g.node").first).to_be_visible()
        if machine_type == "cto_build_project":  # a failure edge around its right side
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.locator("#graph").screenshot(path=str(ARTIFACTS / f"graph-{machine_type}.png"))
        if found := page.evaluate(OUTSIDE):
            clipped[machine_type] = found
        panel = page.locator("#graph").bounding_box()
        drawn = page.locator("#graph svg").bounding_box()
        assert panel is not None and drawn is not None
        assert drawn["x"] + drawn["width"] <= panel["x"] + panel["width"] + 0.5, machine_type
    assert not clipped, clipped
