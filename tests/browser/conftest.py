"""The browser tier: the dashboard in Debian's chromium driven by Playwright (tests/browser/
browser.py), against a deployment of real processes (env_factory: tests/conftest.py)."""

from tests.browser.browser import browser, context, dashboard, page  # noqa: F401 (fixtures)
