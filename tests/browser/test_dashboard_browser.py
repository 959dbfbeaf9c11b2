"""The dashboard in a real browser (Chromium driven by Playwright) against a real deployment: a
Celery worker with beat, an ack bridge, a mock agent and the `fsm-celery dashboard` server, all
separate processes on the suite's own PostgreSQL and Redis.

It proves what a person at the dashboard sees and may do: the pages and the API are closed to
visitors without a token (and a wrong token is refused); signed in, the machines list and a
machine's page follow the machines live (new rows, moving state and status, the graph's current
state and visited path, the growing timeline) without a reload; an admin's Force through the
confirmation dialog moves the machine and is recorded with the signed-in name and the reason;
a viewer sees no admin buttons and cannot act, even with the session's CSRF token. Screenshots
of the machines list and of a machine's page are kept as test artifacts (FSM_TEST_ARTIFACTS,
default test-artifacts/ in the checkout).

The browser is Debian's chromium (/usr/bin/chromium), never a downloaded one.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qs, urlsplit

from playwright.sync_api import BrowserContext, Page, expect

from tests.browser.browser import (
    ARTIFACTS,
    FIX_BUG_CONTEXT,
    PNG_MAGIC,
    WAIT_MS,
    Dashboard,
    assert_not_reloaded,
    hold_first_feed,
    mark_loaded,
    page_fetch,
    sign_in,
    wait_live,
    waiting_machine,
)
from tests.support.credentials import ADMIN_TOKEN, VIEWER_TOKEN
from tests.support.messages import FIX_BUG_STATES

# Records the state and status cells' values of one machine's row whenever they change.
RECORD_ROW = """
(id) => {
  window.__rowSeen = [];
  const record = () => {
    const row = document.querySelector(`tr[data-machine="${id}"]`);
    if (!row) return;
    const seen = [row.querySelector('.state').textContent.trim(),
                  row.querySelector('.status').textContent.trim()];
    const last = window.__rowSeen[window.__rowSeen.length - 1];
    if (!last || last[0] !== seen[0] || last[1] !== seen[1]) window.__rowSeen.push(seen);
  };
  new MutationObserver(record).observe(document.getElementById('machines'),
    {subtree: true, childList: true, characterData: true});
  record();
}
"""


def in_order(seen: list[str], path: list[str]) -> bool:
    """Every state seen is on the path, in the path's order."""
    position = {state: i for i, state in enumerate(path)}
    indexes = [position.get(state, -1) for state in seen]
    return -1 not in indexes and indexes == sorted(indexes)


def collapsed(values: list[str]) -> list[str]:
    return [v for i, v in enumerate(values) if i == 0 or values[i - 1] != v]


# ---- the tests ----------------------------------------------------------------------------


def test_without_a_token_pages_send_to_sign_in_a_wrong_token_is_refused_and_the_api_says_401(
    dashboard: Dashboard, page: Page, context: BrowserContext
) -> None:
    mid = waiting_machine(dashboard.env)
    for path in ("/", f"/machines/{mid}"):
        answer = context.request.get(dashboard.at(path), max_redirects=0)
        assert answer.status == 303, path
        location = urlsplit(answer.headers["location"])
        assert (location.path, parse_qs(location.query)) == ("/login", {"next": [path]})

    page.goto(dashboard.at(f"/machines/{mid}"))
    expect(page).to_have_url(re.compile(r"/login\?next="), timeout=WAIT_MS)
    expect(page.locator("#login-error")).to_have_count(0)
    page.fill("input[name=token]", "not-a-token-this-dashboard-knows-" + "x" * 20)
    page.fill("input[name=name]", "Mallory")
    with page.expect_response(
        lambda r: r.request.method == "POST" and urlsplit(r.url).path == "/login"
    ) as refused:
        page.click("form[action='/login'] button[type=submit]")
    assert refused.value.status == 401
    expect(page.locator("#login-error")).to_be_visible(timeout=WAIT_MS)
    expect(page.locator("#machines, #machine")).to_have_count(0)
    assert page.evaluate("document.body.dataset.admin") == "false"

    for path in ("/api/machines", f"/api/machines/{mid}", "/api/agents", "/api/events"):
        answer = context.request.get(dashboard.at(path), max_redirects=0)
        assert answer.status == 401, path
        assert answer.json()["error"]["status"] == 401
        assert answer.headers["www-authenticate"] == "Bearer"
    wrong = context.request.get(
        dashboard.at("/api/machines"), headers={"authorization": "Bearer wrong-token"}
    )
    assert wrong.status == 401
    forced = context.request.post(
        dashboard.at(f"/api/machines/{mid}/force"), data={"state": "SECOND", "reason": "x"}
    )
    assert forced.status == 401
    assert dashboard.env.client.get_machine(mid).current_state == "FIRST"


def test_a_machine_started_after_the_list_loaded_appears_and_moves_live_until_completed(
    dashboard: Dashboard, page: Page
) -> None:
    env = dashboard.env
    sign_in(page, dashboard, ADMIN_TOKEN, "Ada")
    expect(page.locator("table#machines")).to_be_visible(timeout=WAIT_MS)
    expect(page.locator("#agents")).to_be_visible(timeout=WAIT_MS)
    wait_live(page)
    mark_loaded(page)

    mid = env.client.start_machine("cto_fix_bug", FIX_BUG_CONTEXT)
    row = page.locator(f'table#machines tr[data-machine="{mid}"]')
    expect(row).to_be_visible(timeout=WAIT_MS)
    page.evaluate(RECORD_ROW, str(mid))
    expect(row.locator(".status")).to_have_text("running", timeout=WAIT_MS)
    expect(row.locator(".state")).to_have_text("WRITE_FIX", timeout=WAIT_MS)  # a slow state
    expect(row.locator(".status")).to_have_text("completed", timeout=WAIT_MS)
    expect(row.locator(".state")).to_have_text("COMPLETE", timeout=WAIT_MS)
    expect(row.locator("a")).to_have_attribute("href", f"/machines/{mid}")
    issue = str(FIX_BUG_CONTEXT["githubIssue"])
    expect(row.locator("td").nth(5)).to_have_text(issue)  # the new row's issue, from its event

    assert_not_reloaded(page)
    seen: list[list[str]] = page.evaluate("window.__rowSeen")
    states = collapsed([state for state, _ in seen])
    assert in_order(states, FIX_BUG_STATES), seen
    assert len(states) >= 3, seen
    assert seen[-1] == ["COMPLETE", "completed"], seen
    assert {status for _, status in seen[:-1]} == {"running"}, seen
    assert env.client.get_machine(mid).status == "completed"


def test_a_machines_page_moves_the_graph_marks_the_path_and_grows_the_timeline_live(
    dashboard: Dashboard, page: Page
) -> None:
    env = dashboard.env
    sign_in(page, dashboard, ADMIN_TOKEN, "Ada")
    mid = env.client.start_machine("cto_fix_bug", FIX_BUG_CONTEXT)
    page.goto(dashboard.at(f"/machines/{mid}"))
    graph = page.locator("#graph")
    expect(graph.locator("g.node")).to_have_count(len(FIX_BUG_STATES) + 1, timeout=WAIT_MS)
    wait_live(page)
    mark_loaded(page)
    loaded_with = page.locator("#timeline li").count()
    assert loaded_with >= 1  # the start, at least

    expect(graph).to_have_attribute("data-current", "WRITE_FIX", timeout=WAIT_MS)
    expect(graph.locator("g.node.current")).to_have_attribute("data-state", "WRITE_FIX")
    expect(page.locator("#m-state")).to_have_text("WRITE_FIX")
    expect(page.locator("#m-status")).to_have_text("running")
    expect(graph).to_have_attribute("data-current", "COMPLETE", timeout=WAIT_MS)
    expect(page.locator("#m-status")).to_have_text("completed", timeout=WAIT_MS)
    expect(page.locator("#m-state")).to_have_text("COMPLETE")
    current = graph.locator("g.node.current")
    expect(current).to_have_count(1)
    expect(current).to_have_attribute("data-state", "COMPLETE")

    history = env.client.history(mid)
    assert [h.to_state for h in history] == FIX_BUG_STATES
    timeline = page.locator("#timeline li")
    expect(timeline).to_have_count(len(history), timeout=WAIT_MS)  # grew to one item a row
    assert len(history) > loaded_with
    expect(timeline.first).to_contain_text("DEPLOY → COMPLETE")

    for state in FIX_BUG_STATES:  # the path taken is marked, the failure state is not
        expect(graph.locator(f'g.node[data-state="{state}"]')).to_have_class(
            re.compile(r"\bvisited\b")
        )
    expect(graph.locator('g.node[data-state="FAILED"]')).not_to_have_class(
        re.compile(r"\bvisited\b")
    )
    expect(graph.locator("g.edge.visited")).to_have_count(len(FIX_BUG_STATES) - 1)

    assert_not_reloaded(page)
    seen: list[list[str | None]] = page.evaluate("window.__graphSeen")
    assert all(attribute == node for attribute, node in seen), seen  # always in step
    states = collapsed([str(attribute) for attribute, _ in seen])
    assert in_order(states, FIX_BUG_STATES), seen
    assert len(states) >= 3, seen
    assert "WRITE_FIX" in states, seen  # a slow state, seen while it lasted
    assert states[-1] == "COMPLETE", seen


def test_pages_updated_live_show_what_a_reload_of_them_shows(
    dashboard: Dashboard, context: BrowserContext
) -> None:
    env = dashboard.env
    listing = context.new_page()
    sign_in(listing, dashboard, ADMIN_TOKEN, "Ada")
    wait_live(listing)
    mid = env.client.start_machine("cto_fix_bug", FIX_BUG_CONTEXT)
    machine = context.new_page()
    machine.goto(dashboard.at(f"/machines/{mid}"))
    wait_live(machine)
    mark_loaded(listing)
    mark_loaded(machine)
    row = f'tr[data-machine="{mid}"]'
    expect(listing.locator(f"{row} .status")).to_have_text("completed", timeout=WAIT_MS)
    expect(machine.locator("#m-status")).to_have_text("completed", timeout=WAIT_MS)
    assert_not_reloaded(listing)
    assert_not_reloaded(machine)

    def row_shows(page: Page) -> dict[str, str]:
        return {c: page.locator(f"{row} .{c}").inner_text() for c in ("state", "status", "step")}

    def machine_shows(page: Page) -> dict[str, Any]:
        return {
            "state": page.locator("#m-state").inner_text(),
            "status": page.locator("#m-status").inner_text(),
            "step": page.locator("#m-step").inner_text(),
            "retries": page.locator("#m-retries").inner_text(),
            "graph": page.locator("#graph").get_attribute("data-current"),
            "timeline": page.locator("#timeline li .line").all_inner_texts(),
            "buttons": page.locator("#actions button:visible").all_inner_texts(),
        }

    live_row, live_machine = row_shows(listing), machine_shows(machine)
    listing.reload()
    machine.reload()
    expect(machine.locator("#graph")).to_have_attribute("data-current", "COMPLETE")
    server = env.client.get_machine(mid)
    assert row_shows(listing) == {
        "state": "COMPLETE",
        "status": "completed",
        "step": str(server.attempt),
    }
    differences = [
        f"{where} {key}: live {live[key]!r}, reloaded {reloaded[key]!r}"
        for where, live, reloaded in (
            ("the list's row", live_row, row_shows(listing)),
            ("the machine's page", live_machine, machine_shows(machine)),
        )
        for key in live
        if live[key] != reloaded[key]
    ]
    assert not differences, "; ".join(differences)


def test_a_machine_page_catches_up_with_what_happened_before_its_feed_was_subscribed(
    dashboard: Dashboard, page: Page
) -> None:
    """The page reads the machine, then subscribes to its events: a step taken in between is
    in no event it receives. Its subscription is held back here while the machine is paused;
    subscribed, the page reads the step it missed and shows it, in place, without a reload."""
    env = dashboard.env
    mid = waiting_machine(env)
    held = hold_first_feed(page)
    sign_in(page, dashboard, ADMIN_TOKEN, "Ada", then=f"/machines/{mid}")
    expect(page.locator("#m-status")).to_have_text("running", timeout=WAIT_MS)
    while not held:  # the page asked for its feed: the request waits here
        page.wait_for_timeout(50)
    mark_loaded(page)
    env.client.pause(mid, "ops", "between the page and its feed")
    held[0].continue_()
    wait_live(page)
    expect(page.locator("#m-status")).to_have_text("paused")
    expect(page.locator("#timeline li").first).to_contain_text("pause")
    expect(page.locator("#timeline li").first).to_contain_text("by ops")
    shown = page.locator("#timeline li").evaluate_all("items => items.map(i => i.dataset.attempt)")
    assert shown == [str(h.attempt) for h in reversed(env.client.history(mid))]
    expect(page.locator("#m-step")).to_have_text(str(env.client.get_machine(mid).attempt))
    env.client.resume(mid, "ops")  # and once live, steps arrive without a reload
    expect(page.locator("#m-status")).to_have_text("running", timeout=WAIT_MS)
    expect(page.locator("#timeline li").first).to_contain_text("resume")
    assert_not_reloaded(page)


def test_the_machines_list_catches_up_with_what_happened_before_its_feed_was_subscribed(
    dashboard: Dashboard, page: Page
) -> None:
    """As the machine's page does: a machine of the list paused between the list's reading and
    its subscription shows as paused once the list is live, without a reload."""
    env = dashboard.env
    mid = waiting_machine(env)
    held = hold_first_feed(page)
    sign_in(page, dashboard, ADMIN_TOKEN, "Ada")
    row = page.locator(f'tr[data-machine="{mid}"]')
    expect(row.locator(".status")).to_have_text("running", timeout=WAIT_MS)
    while not held:
        page.wait_for_timeout(50)
    mark_loaded(page)
    env.client.pause(mid, "ops", "between the list and its feed")
    held[0].continue_()
    wait_live(page)
    info = env.client.get_machine(mid)
    expect(row.locator(".status")).to_have_text("paused")
    expect(row.locator(".step")).to_have_text(str(info.attempt))
    env.client.resume(mid, "ops")  # and once live, by its events
    expect(row.locator(".status")).to_have_text("running", timeout=WAIT_MS)
    assert_not_reloaded(page)


def test_an_admin_forces_a_state_through_the_dialog_and_the_history_names_them_and_why(
    dashboard: Dashboard, page: Page
) -> None:
    env = dashboard.env
    mid = waiting_machine(env)
    sign_in(page, dashboard, ADMIN_TOKEN, "Ada Lovelace", then=f"/machines/{mid}")
    expect(page.locator("body")).to_have_attribute("data-admin", "true")
    graph = page.locator("#graph")
    expect(graph).to_have_attribute("data-current", "FIRST", timeout=WAIT_MS)
    wait_live(page)
    mark_loaded(page)

    page.click("#actions button[data-action=force]")
    dialog = page.locator("dialog#confirm")
    expect(dialog).to_be_visible(timeout=WAIT_MS)
    page.locator("dialog#confirm select[name=state]").select_option("SECOND")
    reason = "the analysis was done by hand (browser test)"
    page.fill("#confirm-reason", reason)
    page.click("#confirm-ok")
    expect(dialog).to_be_hidden(timeout=WAIT_MS)
    expect(page.locator("#confirm-error")).to_be_hidden()

    expect(graph).to_have_attribute("data-current", "SECOND", timeout=WAIT_MS)
    expect(graph.locator("g.node.current")).to_have_attribute("data-state", "SECOND")
    expect(page.locator("#m-state")).to_have_text("SECOND")
    expect(page.locator("#m-status")).to_have_text("running")
    expect(page.locator("#timeline li").first).to_contain_text("force")
    expect(page.locator("#timeline li").first).to_contain_text("by Ada Lovelace")
    expect(graph.locator('g.node[data-state="FIRST"]')).to_have_class(re.compile(r"\bvisited\b"))
    assert_not_reloaded(page)

    history = env.client.history(mid)
    forced = history[-1]
    assert (forced.event, forced.from_state, forced.to_state) == ("force", "FIRST", "SECOND")
    assert (forced.actor, forced.reason) == ("Ada Lovelace", reason)
    assert [h.event for h in history].count("force") == 1
    info = env.client.get_machine(mid)
    assert (info.status, info.current_state) == ("running", "SECOND")


def test_a_viewer_sees_no_admin_buttons_and_cannot_act_even_with_the_sessions_csrf_token(
    dashboard: Dashboard, page: Page, context: BrowserContext
) -> None:
    env = dashboard.env
    mid = waiting_machine(env)
    sign_in(page, dashboard, VIEWER_TOKEN, "Vera")
    expect(page.locator("body")).to_have_attribute("data-admin", "false")
    expect(page.locator(f'tr[data-machine="{mid}"]')).to_be_visible(timeout=WAIT_MS)
    expect(page.locator("[data-bulk]")).to_have_count(0)

    page.goto(dashboard.at(f"/machines/{mid}"))
    expect(page.locator("#graph")).to_have_attribute("data-current", "FIRST", timeout=WAIT_MS)
    expect(page.locator("#actions")).to_have_count(0)
    expect(page.locator("[data-action]")).to_have_count(0)

    for action, body in (
        ("force", {"state": "SECOND", "reason": "a viewer tries"}),
        ("cancel", {"reason": "a viewer tries"}),
        ("pause", {"reason": "a viewer tries"}),
    ):
        answer = page_fetch(page, "POST", f"/api/machines/{mid}/{action}", body)
        assert answer["status"] == 403, (action, answer)
        assert "admin" in answer["body"]["error"]["message"], answer  # the role, not the CSRF
    by_token = context.request.post(
        dashboard.at(f"/api/machines/{mid}/force"),
        data={"state": "SECOND", "reason": "a viewer's token tries"},
        headers={"authorization": f"Bearer {VIEWER_TOKEN}"},
    )
    assert by_token.status == 403
    started = page_fetch(page, "POST", "/api/machines", {"type": "test_pair", "context": {}})
    assert started["status"] == 403, started

    info = env.client.get_machine(mid)
    assert (info.status, info.current_state) == ("running", "FIRST")
    assert [h.event for h in env.client.history(mid)] == ["start"]
    expect(page.locator("#m-state")).to_have_text("FIRST")


def test_screenshots_of_the_machines_list_and_a_machines_page_are_kept_as_artifacts(
    dashboard: Dashboard, page: Page
) -> None:
    env = dashboard.env
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    listing = ARTIFACTS / "dashboard-machines.png"
    machine = ARTIFACTS / "dashboard-machine.png"
    for old in (listing, machine):
        old.unlink(missing_ok=True)

    sign_in(page, dashboard, ADMIN_TOKEN, "Ada")
    mid = env.client.start_machine("cto_fix_bug", FIX_BUG_CONTEXT)
    page.goto(dashboard.at(f"/machines/{mid}"))
    expect(page.locator("#m-status")).to_have_text("completed", timeout=WAIT_MS)
    expect(page.locator("#graph g.edge.visited")).to_have_count(len(FIX_BUG_STATES) - 1)
    page.screenshot(path=str(machine), full_page=True)

    page.goto(dashboard.at("/"))
    expect(page.locator(f'tr[data-machine="{mid}"] .status')).to_have_text(
        "completed", timeout=WAIT_MS
    )
    page.screenshot(path=str(listing), full_page=True)

    for shot in (listing, machine):
        data = shot.read_bytes()
        assert len(data) > 1000 and data.startswith(PNG_MAGIC), shot


def test_an_admin_rewinds_and_forks_from_the_timeline_with_the_contexts_preview(
    dashboard: Dashboard, page: Page
) -> None:
    env = dashboard.env
    mid = waiting_machine(env)
    sign_in(page, dashboard, ADMIN_TOKEN, "Ada Lovelace", then=f"/machines/{mid}")
    start = page.locator("#timeline li").last  # the start row: step 0, FIRST
    start.locator("button[data-travel=rewind]").click()
    dialog = page.locator("dialog#confirm")
    expect(dialog).to_be_visible()
    expect(dialog.locator("#confirm-title")).to_have_text("Rewind to step 0 (FIRST)?")
    expect(dialog.locator("#travel-context")).to_contain_text('"retryCount": 0')
    page.fill("#travel-edits", '{"hint": "try the other door"}')
    page.fill("#confirm-reason", "a hint for the agent (browser test)")
    page.click("#confirm-ok")
    expect(page.locator("#timeline li").first).to_contain_text("rewind", timeout=WAIT_MS)
    expect(page.locator("#timeline li").first).to_contain_text("by Ada Lovelace")
    info = env.client.get_machine(mid)
    assert (info.current_state, info.attempt, info.context["hint"]) == (
        "FIRST",
        2,
        "try the other door",
    )
    rewound = env.client.history(mid)[-1]
    assert (rewound.event, rewound.reason) == (
        "rewind",
        "to step 0: a hint for the agent (browser test)",
    )

    page.locator("#timeline li").last.locator("button[data-travel=fork]").click()
    page.fill("#travel-edits", "not json")
    page.click("#confirm-ok")
    expect(page.locator("#confirm-error")).to_contain_text("edits")
    page.fill("#travel-edits", "")
    page.click("#confirm-ok")
    expect(page.locator("#m-forked")).to_contain_text(str(mid)[:8], timeout=WAIT_MS)
    [fork] = env.client.forks(mid)
    assert (fork.forked_from, fork.forked_at, fork.current_state) == (mid, 0, "FIRST")
    assert "hint" not in fork.context  # the context after step 0, as it was
