"""The dashboard in a real browser, shared by its browser tests: one deployment per test module
(a Celery worker with beat, an ack bridge, a slow mock `cto` agent and the `fsm-celery dashboard`
server, separate processes on the suite's PostgreSQL and Redis), Debian's chromium driven by
Playwright (/usr/bin/chromium, never a downloaded one), a fresh profile per test, and the steps
a person takes (sign in, wait for the live feed)."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import (
    Browser,
    BrowserContext,
    Page,
    Playwright,
    expect,
    sync_playwright,
)

from tests.support import ROOT
from tests.support.processes import FsmEnv

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WAIT_MS = 30_000  # every browser wait is bounded by this
ARTIFACTS = Path(os.environ.get("FSM_TEST_ARTIFACTS") or ROOT / "test-artifacts")
# The mock agent lingers in these states, so that a page sees the machine in them and moves on.
SLOW = {"ANALYZE_BUG": 1.5, "WRITE_FIX": 1.5}
FIX_BUG_CONTEXT = {"projectName": "sla-api", "githubIssue": 740, "projectPath": "/srv/sla-api"}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# Installed in every page before its own scripts: records each value #graph's data-current
# takes, with the state of the node marked current at that moment (graph.js sets both in
# update()), so that a test can tell which states the page showed, in order.
RECORD_GRAPH = """
window.__graphSeen = [];
new MutationObserver((records) => {
  for (const r of records) {
    const node = document.querySelector('#graph g.node.current');
    window.__graphSeen.push([r.target.dataset.current, node ? node.dataset.state : null]);
  }
}).observe(document, {subtree: true, attributes: true, attributeFilter: ['data-current']});
"""


@dataclass
class Dashboard:
    env: FsmEnv
    url: str

    def at(self, path: str) -> str:
        return self.url + path


@pytest.fixture(scope="module")
def dashboard(env_factory: Callable[..., FsmEnv]) -> Iterator[Dashboard]:
    """One deployment for the module: worker (with beat), bridge, a slow mock `cto` agent, and
    the dashboard server. Nobody serves the fixtures' `tester` agent type, so a test_pair
    machine waits in FIRST until someone acts on it. Stopped with the module: the next module's
    has the same name (its database, queue and channel prefix)."""
    env = env_factory("browser")
    env.start_worker()
    env.start_bridge()
    slow = [arg for state, seconds in SLOW.items() for arg in ("--slow", f"{state}={seconds}")]
    env.start_agent("--mock", "--agent-type", "cto", *slow)
    env.wait_for_agents(1)
    _, url = env.start_dashboard()
    yield Dashboard(env, url)
    env.stop_all()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(
            f"the browser tests need Debian's chromium at {CHROMIUM}: "
            "`sudo apt-get install --no-install-recommends chromium` (.ci/run installs it); "
            "never `playwright install`"
        )
    with sync_playwright() as playwright:
        launched = _launch(playwright)
        yield launched
        launched.close()


def _launch(playwright: Playwright) -> Browser:
    return playwright.chromium.launch(
        executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
    )


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    """A fresh browser profile per test: no cookie carries over from another test."""
    made = browser.new_context(viewport={"width": 1400, "height": 1000})
    made.set_default_timeout(WAIT_MS)
    made.set_default_navigation_timeout(WAIT_MS)
    made.add_init_script(RECORD_GRAPH)
    yield made
    made.close()


@pytest.fixture
def page(context: BrowserContext) -> Page:
    return context.new_page()


# ---- helpers ------------------------------------------------------------------------------


def sign_in(page: Page, dashboard: Dashboard, token: str, name: str, then: str = "/") -> None:
    """Sign in through the form, as a person does, and land on `then`."""
    page.goto(dashboard.at(then))
    expect(page).to_have_url(re.compile(r"/login\?"), timeout=WAIT_MS)
    page.fill("input[name=token]", token)
    page.fill("input[name=name]", name)
    page.click("form[action='/login'] button[type=submit]")
    expect(page).to_have_url(dashboard.at(then), timeout=WAIT_MS)


def wait_live(page: Page) -> None:
    """The page's event stream is connected (the server said hello) and what the page shows is
    whole (a machine's page first reads what it missed: dashboard.js's caughtUp)."""
    expect(page.locator("#live")).to_have_class(re.compile(r"\bon\b"), timeout=WAIT_MS)


def hold_first_feed(page: Page) -> list[Any]:
    """Hold back the page's first request for its live feed (those after it go through): the
    list returned receives it, for the test to let it go on (`.continue_()`) when it wants."""
    held: list[Any] = []

    def hold(route: Any) -> None:
        if held:
            route.continue_()
        else:
            held.append(route)

    page.route("**/api/events?*", hold)
    return held


def mark_loaded(page: Page) -> None:
    """Mark this window: a reload would make a new one, without the mark."""
    page.evaluate("window.__noReload = true")


def assert_not_reloaded(page: Page) -> None:
    assert page.evaluate("window.__noReload === true"), "the page was reloaded"


def waiting_machine(env: FsmEnv) -> uuid.UUID:
    """A test_pair machine, waiting in FIRST (nobody serves its agent type)."""
    mid = env.client.start_machine("test_pair", {})
    info = env.client.get_machine(mid)
    assert (info.status, info.current_state) == ("running", "FIRST")
    return mid


def page_fetch(page: Page, method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """A request from the page's own script, with its session cookie and CSRF token."""
    result: dict[str, Any] = page.evaluate(
        """async ([method, path, body]) => {
          const csrf = document.querySelector('meta[name="csrf-token"]').content;
          const response = await fetch(path, {
            method, credentials: 'same-origin', body: JSON.stringify(body),
            headers: {'content-type': 'application/json', 'x-csrf-token': csrf},
          });
          return {status: response.status, body: await response.json().catch(() => null)};
        }""",
        [method, path, body],
    )
    return result


# Every control a person can see and use (links, buttons, fields, summaries) whose text has a
# WCAG 2 contrast ratio below the bound against what it is drawn on: the text's computed colour
# over the first opaque background up its ancestors (translucent ones blended in), white at the
# top. Disabled controls are exempt, as WCAG exempts them.
LOW_CONTRAST = """
(least) => {
  const parse = (text) => {
    const m = text.match(/rgba?\\(([^)]+)\\)/);
    if (!m) return [0, 0, 0, 0];
    const parts = m[1].split(/[ ,\\/]+/).filter(Boolean).map(Number);
    return [parts[0], parts[1], parts[2], parts.length > 3 ? parts[3] : 1];
  };
  const over = ([r, g, b, a], [R, G, B]) =>
    [r * a + R * (1 - a), g * a + G * (1 - a), b * a + B * (1 - a)];
  const background = (node) => {
    const layers = [];
    for (let n = node; n && n.nodeType === 1; n = n.parentElement) {
      const c = parse(getComputedStyle(n).backgroundColor);
      if (c[3] > 0) layers.push(c);
      if (c[3] >= 1) break;
    }
    let rgb = [255, 255, 255];
    for (const layer of layers.reverse()) rgb = over(layer, rgb);
    return rgb;
  };
  const luminance = (rgb) => {
    const [r, g, b] = rgb.map((v) => {
      const s = v / 255;
      return s <= 0.03928 ? s / 12.92 : ((s + 0.055) / 1.055) ** 2.4;
    });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  const ratio = (a, b) => {
    const [hi, lo] = [luminance(a), luminance(b)].sort((x, y) => y - x);
    return (hi + 0.05) / (lo + 0.05);
  };
  const controls = document.querySelectorAll(
    "a[href], button, input:not([type=hidden]), select, textarea, summary, [role=button]");
  const low = [];
  for (const c of controls) {
    const box = c.getBoundingClientRect();
    const hidden = !box.width || !box.height || getComputedStyle(c).visibility !== "visible";
    if (c.disabled || hidden) continue;
    const back = background(c);
    const fore = over(parse(getComputedStyle(c).color), back);
    const found = ratio(fore, back);
    if (found < least) {
      const text = (c.innerText || c.value || c.getAttribute("aria-label") || c.name || "").trim();
      low.push(`${c.tagName.toLowerCase()} "${text.slice(0, 40)}": ${found.toFixed(2)}:1`);
    }
  }
  return low;
}
"""
TEXT_CONTRAST = 4.5  # WCAG 2 AA for text


def low_contrast(page: Page) -> list[str]:
    """The controls of the page whose text does not stand out enough (see LOW_CONTRAST)."""
    found: list[str] = page.evaluate(LOW_CONTRAST, TEXT_CONTRAST)
    return found
