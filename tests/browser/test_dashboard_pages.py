"""What the dashboard's pages show, in a real browser against a real deployment (see
tests/browser/browser.py): only the buttons a machine's status allows, kept in step live;
the step and the state's retries; live history rows with their duration; definition pages that
fit a 1,400 px window, name their version once, show no timeout or retries for terminal states
and show the type's schedules; a 404 page in the layout, still signed in, for a machine that
does not exist; the agents' work one machine a line; the bulk dialog's count. Screenshots of the
definition pages are kept as test artifacts, to be looked at.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from playwright.sync_api import Locator, Page, expect

from fsm_celery.core.admin import commands
from fsm_celery.core.transition import MachineStatus
from fsm_celery.http.pages import duration, retries_text
from fsm_celery.store.reads import MachineFilter
from tests.browser.browser import (
    ARTIFACTS,
    FIX_BUG_CONTEXT,
    WAIT_MS,
    Dashboard,
    assert_not_reloaded,
    mark_loaded,
    sign_in,
    wait_live,
    waiting_machine,
)
from tests.support import FIXTURE_DEFINITIONS
from tests.support.agents import ScriptedAgent
from tests.support.credentials import ADMIN_TOKEN
from tests.support.messages import SILENT, Reply
from tests.support.processes import FsmEnv

LABELS = {
    "pause": "Pause",
    "resume": "Resume",
    "retry": "Retry",
    "force": "Force to state…",
    "budget": "Budget…",
    "cancel": "Cancel",
}
SCROLLS_SIDEWAYS = "document.documentElement.scrollWidth > window.innerWidth"


def buttons(page: Page) -> list[str]:
    """The machine's action buttons a person sees."""
    return page.locator("#actions button:visible").all_inner_texts()


def offered(status: str) -> list[str]:
    """The buttons of what core/admin.py lets an operator do in the status, in the page's order."""
    allowed = commands(MachineStatus(status))
    return [label for action, label in LABELS.items() if action in allowed]


def api_machine(page: Page, machine_id: uuid.UUID) -> dict[str, Any]:
    answer = page.request.get(f"{page.url.split('/machines')[0]}/api/machines/{machine_id}")
    assert answer.status == 200, answer.text()
    machine: dict[str, Any] = answer.json()["machine"]
    return machine


def confirm(page: Page, action: str, reason: str) -> None:
    page.click(f"#actions button[data-action={action}]")
    expect(page.locator("dialog#confirm")).to_be_visible(timeout=WAIT_MS)
    page.fill("#confirm-reason", reason)
    page.click("#confirm-ok")
    expect(page.locator("dialog#confirm")).to_be_hidden(timeout=WAIT_MS)


def pair_counts(env: FsmEnv, status: str | None = None) -> dict[str, int]:
    """How many test_pair machines there are (in the status), by status."""
    return env.client.count_machines(MachineFilter(status=status, machine_type="test_pair"))


def shot(target: Page | Locator, name: str) -> None:
    """A screenshot kept as a test artifact, for a person to look at."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    if isinstance(target, Page):
        target.screenshot(path=str(ARTIFACTS / name), full_page=True)
    else:
        target.screenshot(path=str(ARTIFACTS / name))


def assert_fits(page: Page, what: str) -> None:
    """Nothing on the page scrolls sideways."""
    widths = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert not page.evaluate(SCROLLS_SIDEWAYS), f"{what} scrolls sideways: {widths}"


# ---- a machine's buttons, step and retries -------------------------------------------------


def test_a_machines_buttons_are_what_its_status_allows_and_follow_it_live(
    dashboard: Dashboard, page: Page
) -> None:
    mid = waiting_machine(dashboard.env)
    sign_in(page, dashboard, ADMIN_TOKEN, "Ada", then=f"/machines/{mid}")
    wait_live(page)
    mark_loaded(page)
    assert buttons(page) == offered("running")
    assert "Resume" not in buttons(page)
    assert api_machine(page, mid)["commands"] == commands(MachineStatus.RUNNING)

    confirm(page, "pause", "a look at it first (browser test)")
    expect(page.locator("#m-status")).to_have_text("paused", timeout=WAIT_MS)
    expect(page.locator("#actions button[data-action=resume]")).to_be_visible()
    assert buttons(page) == offered("paused")
    assert "Pause" not in buttons(page)

    confirm(page, "cancel", "not needed after all (browser test)")
    expect(page.locator("#m-status")).to_have_text("cancelled", timeout=WAIT_MS)
    expect(page.locator("#actions button[data-action=cancel]")).to_be_hidden()
    assert buttons(page) == offered("cancelled") == ["Retry", "Force to state…", "Budget…"]
    assert_not_reloaded(page)
    page.reload()
    assert buttons(page) == offered("cancelled")
    assert api_machine(page, mid)["commands"] == commands(MachineStatus.CANCELLED)


def test_a_completed_machine_offers_no_pause_resume_or_cancel(
    dashboard: Dashboard, page: Page
) -> None:
    env = dashboard.env
    mid = env.client.start_machine("cto_fix_bug", FIX_BUG_CONTEXT)
    assert env.wait_until_done(mid).status == "completed"
    sign_in(page, dashboard, ADMIN_TOKEN, "Ada", then=f"/machines/{mid}")
    assert buttons(page) == ["Force to state…", "Budget…"] == offered("completed")
    assert api_machine(page, mid)["commands"] == ["force", "budget"]


def test_the_step_and_the_states_retries_are_shown_and_follow_a_retry_live(
    dashboard: Dashboard, page: Page
) -> None:
    env = dashboard.env
    gate = threading.Event()
    script = {"FIRST": [Reply(success=False, error="the disk was full"), SILENT]}
    with ScriptedAgent(env, script, gate=gate) as agent:
        mid = env.client.start_machine("test_pair", {}, agent_id=agent.id)
        agent.wait_for_tasks(1)
        sign_in(page, dashboard, ADMIN_TOKEN, "Ada", then=f"/machines/{mid}")
        wait_live(page)
        mark_loaded(page)
        expect(page.locator("#m-step")).to_have_text("1")
        expect(page.locator("#m-retries")).to_have_text("first try (up to 3 retries)")

        gate.set()  # the failed ack goes out: FIRST is tried again
        expect(page.locator("#m-retries")).to_have_text("retry 1 of 3", timeout=WAIT_MS)
        expect(page.locator("#m-step")).to_have_text("2")
        agent.wait_for_tasks(2)
    info = env.client.get_machine(mid)
    assert (info.current_state, info.attempt, info.state_retries) == ("FIRST", 2, 1)
    assert_not_reloaded(page)
    page.reload()
    expect(page.locator("#m-retries")).to_have_text("retry 1 of 3")
    expect(page.locator("#m-step")).to_have_text("2")
    page.goto(dashboard.at("/"))
    expect(page.locator("table#machines th").nth(4)).to_have_text("step")
    expect(page.locator(f'tr[data-machine="{mid}"] .step')).to_have_text("2")


def test_live_history_rows_show_their_duration_as_a_reload_does(
    dashboard: Dashboard, page: Page
) -> None:
    env = dashboard.env
    sign_in(page, dashboard, ADMIN_TOKEN, "Ada")
    mid = env.client.start_machine("cto_fix_bug", FIX_BUG_CONTEXT)
    page.goto(dashboard.at(f"/machines/{mid}"))
    wait_live(page)
    mark_loaded(page)
    expect(page.locator("#m-status")).to_have_text("completed", timeout=WAIT_MS)
    history = env.client.history(mid)
    expect(page.locator("#timeline li")).to_have_count(len(history), timeout=WAIT_MS)
    assert_not_reloaded(page)
    live = page.locator("#timeline li.new")
    assert live.count() >= 3  # the rows that arrived after the page loaded
    expected = [duration(h.duration_ms) for h in reversed(history) if h.duration_ms is not None]
    for i in range(live.count()):
        expect(live.nth(i).locator(".duration")).to_have_text(expected[i])
    lines = page.locator("#timeline li .line").all_inner_texts()
    page.reload()
    assert page.locator("#timeline li .line").all_inner_texts() == lines


def test_the_pages_script_writes_durations_and_retries_as_the_server_does(
    dashboard: Dashboard, page: Page
) -> None:
    sign_in(page, dashboard, ADMIN_TOKEN, "Ada")
    samples = [0, 999, 1000, 1250, 1750, 8449, 59_949, 59_950, 362_375, 11_100_000, 187_200_000]
    assert page.evaluate("(all) => all.map(duration)", samples) == [duration(ms) for ms in samples]
    pairs = [[0, None], [0, 0], [0, 3], [2, 3]]
    script = "(all) => all.map(([used, allowed]) => retriesText(used, allowed))"
    assert page.evaluate(script, pairs) == [retries_text(u, a) for u, a in pairs]


# ---- definition pages ----------------------------------------------------------------------


def test_every_page_fits_a_1400_px_window_without_scrolling_sideways(
    dashboard: Dashboard, page: Page
) -> None:
    env = dashboard.env
    mid = env.client.start_machine("cto_fix_bug", FIX_BUG_CONTEXT)
    long_error = Reply(success=False, error="E" * 600)  # one word wider than any window
    with ScriptedAgent(env, {"FIRST": [long_error] * 4}) as agent:  # its retries, all spent
        failed = env.client.start_machine("test_pair", {}, agent_id=agent.id)
        assert env.wait_until_done(failed).error == "E" * 600
    sign_in(page, dashboard, ADMIN_TOKEN, "Ada")
    assert page.viewport_size == {"width": 1400, "height": 1000}
    for machine_type in env.client.machine_types():
        page.goto(dashboard.at(f"/definitions/{machine_type}"))
        expect(page.locator("#graph g.node").first).to_be_visible(timeout=WAIT_MS)
        assert_fits(page, f"/definitions/{machine_type}")
        table, main = page.locator("table#states").bounding_box(), page.locator("main")
        inside = main.bounding_box()
        assert table is not None and inside is not None
        assert table["x"] + table["width"] <= inside["x"] + inside["width"], machine_type
        if machine_type in SHOTS:
            shot(page, f"definition-{machine_type}.png")
    for path in ("/", "/definitions", f"/machines/{mid}", f"/machines/{failed}", "/machines/x"):
        page.goto(dashboard.at(path))
        assert_fits(page, path)


SHOTS = {"cto_fix_bug", "cto_infrastructure_check", "research_pipeline"}


def test_a_definition_page_names_its_version_once_and_lists_others_when_there_are(
    dashboard: Dashboard, page: Page, tmp_path: Path
) -> None:
    env = dashboard.env
    sign_in(page, dashboard, ADMIN_TOKEN, "Ada", then="/definitions/cto_fix_bug")
    text = page.locator("main").inner_text()
    assert re.findall(r"\bv\d+\b", text) == ["v1"], text
    expect(page.locator("#versions")).to_have_count(0)

    changed = (FIXTURE_DEFINITIONS / "test_linear.yaml").read_text()
    (tmp_path / "test_linear.yaml").write_text(changed + "\ndescription: the second version\n")
    assert env.client.load_definitions(str(tmp_path))[0][1] == 2
    page.goto(dashboard.at("/definitions/test_linear"))
    expect(page.locator("h1")).to_have_text("test_linear v2")
    expect(page.locator("#versions")).to_have_text("Versions: v2 · v1")
    expect(page.locator("#versions b.current")).to_have_text("v2")
    page.click("#versions a")
    expect(page.locator("h1")).to_have_text("test_linear v1")
    expect(page.locator("#versions b.current")).to_have_text("v1")


def test_terminal_states_show_no_timeout_and_no_retries(dashboard: Dashboard, page: Page) -> None:
    sign_in(page, dashboard, ADMIN_TOKEN, "Ada", then="/definitions/cto_fix_bug")
    definition = dashboard.env.client.definition("cto_fix_bug").definition
    for state in definition.states:
        row = page.locator(f'table#states tr[data-state="{state.name}"]')
        if state.terminal is not None:
            expect(row.locator(".timeout")).to_have_text("—")
            expect(row.locator(".retries")).to_have_text("—")
        else:
            expect(row.locator(".timeout")).to_have_text(
                duration(int(state.timeout_seconds * 1000))
            )
            expect(row.locator(".retries")).to_have_text(str(state.max_retries))
    terminal = [s.name for s in definition.states if s.terminal is not None]
    assert terminal == ["COMPLETE", "FAILED"]


def test_the_infrastructure_checks_page_shows_its_schedule_and_whether_it_is_paused(
    dashboard: Dashboard, page: Page
) -> None:
    env = dashboard.env
    ref = "cto_infrastructure_check/every-15-minutes"
    sign_in(page, dashboard, ADMIN_TOKEN, "Ada", then="/definitions/cto_infrastructure_check")
    schedule = page.locator('#schedules [data-schedule="every-15-minutes"]')
    expect(schedule.locator(".cron")).to_have_text("*/15 * * * *")
    expect(schedule).to_contain_text("(UTC)")
    expect(schedule.locator(".overlap")).to_have_text("skip")
    expect(schedule).to_contain_text("active")
    info = env.client.schedule(ref)
    expect(schedule.locator("time.next")).to_have_attribute(
        "datetime", info.next_run_at.isoformat()
    )
    expect(schedule.locator("time.next")).to_contain_text(
        info.next_run_at.strftime("%Y-%m-%d %H:%M:%S")
    )
    env.client.pause_schedule(ref, "Ada", "a browser test looks")
    try:
        page.reload()
        expect(schedule).to_contain_text("paused")
        expect(schedule.locator("time.next")).to_have_text("none while paused")
    finally:
        env.client.resume_schedule(ref, "Ada", "the browser test is done")
    page.goto(dashboard.at("/definitions/cto_fix_bug"))
    expect(page.locator("#schedules")).to_contain_text("None: machines of this type start")


# ---- a machine that does not exist ---------------------------------------------------------


def test_a_bad_machine_address_is_a_404_page_in_the_layout_and_you_stay_signed_in(
    dashboard: Dashboard, page: Page
) -> None:
    sign_in(page, dashboard, ADMIN_TOKEN, "Ada Lovelace")
    unknown = uuid.uuid4()
    for given, named in (
        ("not-a-machine", "'not-a-machine'"),
        (str(unknown), f"'{unknown}'"),
    ):
        answer = page.goto(dashboard.at(f"/machines/{given}"))
        assert answer is not None and answer.status == 404, given
        expect(page.locator("h1")).to_have_text("Not Found 404")
        expect(page.locator("#error-message")).to_have_text(f"no machine with id {named}")
        expect(page.locator("header .role")).to_have_text("Ada Lovelace · admin")
        expect(page.locator("header")).to_contain_text("Sign out")
        expect(page.locator("header")).not_to_contain_text("Sign in")
        assert "Input should be" not in page.content()
        assert_fits(page, f"/machines/{given}")
    shot(page, "dashboard-404.png")
    nul = page.goto(dashboard.at("/machines/%00"))  # refused before routing, as in the API
    assert nul is not None and nul.status == 400
    page.goto(dashboard.at("/"))
    expect(page.locator("table#machines")).to_be_visible()  # still signed in


def test_a_bad_machine_address_sends_a_visitor_to_sign_in_first(
    dashboard: Dashboard, page: Page
) -> None:
    page.goto(dashboard.at("/machines/not-a-machine"))
    expect(page).to_have_url(re.compile(r"/login\?next=%2Fmachines%2Fnot-a-machine$"))


# ---- the machines list ---------------------------------------------------------------------


def test_an_agents_work_is_one_machine_a_line_and_follows_it_live(
    dashboard: Dashboard, page: Page
) -> None:
    env = dashboard.env
    with ScriptedAgent(env, {"FIRST": [SILENT] * 3}) as agent:
        env.client.register_agent(agent.id, "tester")
        mids = [env.client.start_machine("test_pair", {}, agent_id=agent.id) for _ in range(3)]
        agent.wait_for_tasks(3)
        sign_in(page, dashboard, ADMIN_TOKEN, "Ada")
        wait_live(page)
        mark_loaded(page)
        work = page.locator(f'tr[data-agent="{agent.id}"] .work li[data-work]')
        expect(work).to_have_count(3)
        shot(page.locator("#agents"), "dashboard-agents.png")
        tops = [box["y"] for box in (work.nth(i).bounding_box() for i in range(3)) if box]
        assert len(set(tops)) == 3, tops  # one a line
        assert sorted(work.evaluate_all("(items) => items.map((i) => i.dataset.work)")) == sorted(
            str(m) for m in mids
        )
        env.client.cancel(mids[0], "Ada", "one less (browser test)")
        expect(work).to_have_count(2, timeout=WAIT_MS)
        for mid in mids[1:]:
            env.client.cancel(mid, "Ada", "done (browser test)")
        expect(work).to_have_count(0, timeout=WAIT_MS)
        expect(page.locator(f'tr[data-agent="{agent.id}"] .work .idle')).to_have_text("idle")
        assert_not_reloaded(page)


def test_an_admin_revokes_an_agent_from_the_agents_table(dashboard: Dashboard, page: Page) -> None:
    env = dashboard.env
    agent = str(uuid.uuid4())
    env.client.register_agent(agent, "tester", ["reset", "off"], actor="ops")
    sign_in(page, dashboard, ADMIN_TOKEN, "Ada")
    row = page.locator(f'tr[data-agent="{agent}"]')
    row.locator("button[data-revoke]").click()
    expect(page.locator("dialog#confirm")).to_be_visible(timeout=WAIT_MS)
    page.fill("#confirm-reason", "its laptop was lost")
    page.click("#confirm-ok")
    expect(row.locator(".badge")).to_have_text("revoked", timeout=WAIT_MS)
    expect(row.locator("button[data-revoke]")).to_have_count(0)
    [*_, revoked] = env.client.credential_events(agent)
    assert (revoked["action"], revoked["actor"], revoked["reason"]) == (
        "revoked",
        "Ada",
        "its laptop was lost",
    )


def test_the_bulk_dialog_says_how_many_machines_the_filter_matches(
    dashboard: Dashboard, page: Page
) -> None:
    env = dashboard.env
    waiting_machine(env)
    waiting_machine(env)
    sign_in(page, dashboard, ADMIN_TOKEN, "Ada", then="/?status=running&type=test_pair")
    running = pair_counts(env, "running")["running"]
    assert running >= 2
    page.click("button[data-bulk=cancel]")
    text = page.locator("#confirm-text")
    expect(text).to_have_text(
        f"{running} machines match (status=running, type=test_pair); "
        f"{running} of them can be cancelled."
    )
    assert "1,000" not in text.inner_text()
    shot(page, "dashboard-bulk-dialog.png")
    page.click("#confirm-cancel")
    expect(page.locator("dialog#confirm")).to_be_hidden()
    assert pair_counts(env, "running")["running"] == running  # nothing was cancelled

    by_status = pair_counts(env)
    assert set(by_status) - {"running"}, by_status  # others too, which cannot be paused
    page.goto(dashboard.at("/?type=test_pair"))
    page.click("button[data-bulk=pause]")
    expect(text).to_have_text(
        f"{sum(by_status.values())} machines match (type=test_pair); "
        f"{by_status['running']} of them can be paused."
    )
    page.click("#confirm-cancel")

    page.goto(dashboard.at("/?status=completed"))
    expect(page.locator("[data-bulk]")).to_have_count(0)  # a completed machine takes none
    page.goto(dashboard.at("/?status=paused"))
    assert page.locator("[data-bulk]").all_inner_texts() == ["Resume all", "Cancel all"]


def _children(env: FsmEnv, parent: uuid.UUID, count: int) -> list[Any]:
    """The parent's children, once the worker has started `count` of them."""
    deadline = time.monotonic() + WAIT_MS / 1000
    while len(found := env.client.children(parent)) < count:
        assert time.monotonic() < deadline, f"{len(found)} of {count} children started"
        time.sleep(0.1)
    return found


def test_a_parallel_state_is_a_cluster_of_its_branches_that_follows_its_children_live(
    dashboard: Dashboard, page: Page
) -> None:
    env = dashboard.env
    mid = env.client.start_machine("test_fan_parallel", {})
    tests = next(c for c in _children(env, mid, 2) if c.branch == "tests")
    sign_in(page, dashboard, ADMIN_TOKEN, "Ada", then=f"/machines/{mid}")
    wait_live(page)
    mark_loaded(page)
    expect(page.locator("#graph g.cluster.branch")).to_have_count(2)
    writing = page.locator('#graph g.node[data-path="BUILD/tests/WRITE"]')
    expect(writing).to_have_class(re.compile(r"\bcurrent\b.*\bstatus-running\b"))
    expect(page.locator("#children tr[data-machine]")).to_have_count(2)

    env.client.cancel(tests.id, "ada", "not needed (browser test)")  # the join fails: all
    row = page.locator(f'#children tr[data-machine="{tests.id}"] .status')
    expect(row).to_have_text("cancelled", timeout=WAIT_MS)
    expect(writing).to_have_class(re.compile(r"\bstatus-cancelled\b"))
    expect(page.locator("#fan-outs td.cancelled")).to_have_text("2")  # the other by the join
    expect(page.locator("#m-status")).to_have_text("failed")
    page.screenshot(path=str(ARTIFACTS / "parallel-machine.png"), full_page=True)
    assert_not_reloaded(page)


def test_a_map_state_is_one_node_with_its_counts_kept_live(
    dashboard: Dashboard, page: Page
) -> None:
    env = dashboard.env
    mid = env.client.start_machine("test_fan_map", {"items": list(range(5)), "prefix": "p"})
    first = next(c for c in _children(env, mid, 2) if c.branch == "0")
    sign_in(page, dashboard, ADMIN_TOKEN, "Ada", then=f"/machines/{mid}")
    wait_live(page)
    mark_loaded(page)
    counts = page.locator('#graph g.node[data-state="EACH"] text.sub')
    expect(counts).to_have_text("0 done · 0 failed · 2 running · 3 waiting")
    env.client.cancel(first.id, "ada", "not needed (browser test)")  # the next item starts
    expect(counts).to_have_text("0 done · 0 failed · 2 running · 2 waiting", timeout=WAIT_MS)
    expect(page.locator("#children tr[data-machine]")).to_have_count(3)
    expect(page.locator("#children-more")).to_have_text("… 2 more: 2 waiting")
    page.screenshot(path=str(ARTIFACTS / "map-machine.png"), full_page=True)
    assert_not_reloaded(page)
