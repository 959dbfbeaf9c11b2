"""An approval gate in a real browser (Debian's chromium): the approvals page lists the gate, a
signed-in approver fills in the form built from its schema and approves, a second approver's
decision meets the quorum, and the timeline names them; someone outside the gate's groups gets
no form, and the API refuses them even with their session's CSRF token."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.browser import WAIT_MS, Dashboard, page_fetch, sign_in
from tests.integration.test_approvals import ALICE, APPROVERS, CAROL, DAVE
from tests.support.agents import ScriptedAgent
from tests.support.processes import FsmEnv


@pytest.fixture(scope="module")
def gates_dashboard(env_factory: Callable[..., FsmEnv]) -> Iterator[Dashboard]:
    env = env_factory("gates_browser", approvers=APPROVERS)
    env.start_worker()
    env.start_bridge()
    _, url = env.start_dashboard()
    yield Dashboard(env, url)
    env.stop_all()


def _person(browser: Browser) -> Page:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(WAIT_MS)
    return context.new_page()


def test_two_approvers_decide_through_the_form_and_the_timeline_names_them(
    gates_dashboard: Dashboard, browser: Browser
) -> None:
    env = gates_dashboard.env
    with ScriptedAgent(env) as agent:
        mid = env.client.start_machine("test_gate", {}, agent_id=agent.id)
        env.wait_for_gate(mid, "REVIEW")

        alice = _person(browser)
        sign_in(alice, gates_dashboard, ALICE, "typed name", then="/approvals")
        row = alice.locator(f'#approvals tr[data-machine="{mid}"]')
        expect(row).to_contain_text("REVIEW")
        expect(row).to_contain_text("0 of 2")
        row.locator("a").click()
        form = alice.locator("form#decision")
        expect(form).to_be_visible()
        expect(form.locator("select[name=target] option")).to_have_count(3)  # blank, 2 choices
        form.locator("button#approve").click()  # the form's required field left out
        expect(alice.locator("#decision-error")).to_contain_text("target")
        form.locator("select[name=target]").select_option("production")
        form.locator("textarea[name=__comment]").fill("staging is green")
        form.locator("button#approve").click()
        expect(alice.locator("#gate-count")).to_contain_text("1 of 2 approvals")
        expect(alice.locator("#gate-decisions")).to_contain_text("alice approved")
        expect(alice.locator("#gate-decisions")).to_contain_text("staging is green")

        dave = _person(browser)  # ops, not release: no form, and the API says no
        sign_in(dave, gates_dashboard, DAVE, "dave", then=f"/machines/{mid}")
        expect(dave.locator("#decide")).to_contain_text("Only release")
        expect(dave.locator("form#decision")).to_have_count(0)
        refused = page_fetch(
            dave,
            "POST",
            f"/api/machines/{mid}/decisions",
            {"decision": "approve", "fields": {"target": "staging"}},
        )
        assert refused["status"] == 403, refused

        carol = _person(browser)
        sign_in(carol, gates_dashboard, CAROL, "carol", then=f"/machines/{mid}")
        carol.locator("form#decision select[name=target]").select_option("production")
        carol.locator("form#decision button#approve").click()
        expect(carol.locator("#decide")).to_have_count(0, timeout=WAIT_MS)  # the gate closed
        timeline = carol.locator("#timeline li").filter(has_text="approval")
        expect(timeline).to_contain_text("REVIEW → SHIP_PROD")
        expect(timeline).to_contain_text("by carol")
        expect(carol.locator("#m-state")).to_have_text(re.compile("SHIP_PROD|DONE"))
        info = env.wait_until_done(mid)
    assert info.status == "completed"
    made = env.client.decisions(mid)["decisions"]
    assert [(d["actor"], d["via"]) for d in made] == [
        ("alice", "dashboard"),
        ("carol", "dashboard"),
    ]
