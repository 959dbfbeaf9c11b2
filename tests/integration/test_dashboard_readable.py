"""What the dashboard shows can be read, in a real browser against a real deployment (see
tests/integration/browser.py): every control's text stands out from what it is drawn on (WCAG's
4.5:1, computed in the page from computed styles); the graph's edges stay inside its panel; a
finished machine shows no deadline; a definition's states table names approval and wait edges;
the machines list shows the machines people started (children on their parent's page, or all
of them on asking).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from playwright.sync_api import Page, expect

from tests.integration.browser import (
    FIX_BUG_CONTEXT,
    WAIT_MS,
    Dashboard,
    low_contrast,
    sign_in,
    wait_live,
    waiting_machine,
)
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
    gate = env.client.start_machine("test_gate", {})
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
