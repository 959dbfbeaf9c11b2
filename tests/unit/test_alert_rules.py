"""deploy/: the alert rules are valid, each is unit-tested by promtool (Debian's `prometheus`
package), each links to its runbook section; the example scrape config holds the jobs they
assume; the Grafana dashboard's queries parse. (tests/integration/test_prometheus.py runs them
on a real Prometheus scraping a real deployment.)"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from fsm_celery.metrics.catalog import BY_NAME
from tests.support.prometheus import (
    OPERATIONS,
    RULE_TESTS,
    RULES,
    SCRAPE_CONFIG,
    grafana_variables,
    panel_queries,
    promtool,
    rules,
)

JOBS = {"fsm-worker", "fsm-bridge", "fsm-beat", "fsm-dashboard", "fsm-agent"}


def test_the_rules_are_valid() -> None:
    done = promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_rule_passes_its_unit_tests() -> None:
    done = promtool("test", "rules", *(str(path) for path in RULE_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("SUCCESS") == len(RULE_TESTS), done.stdout


def test_every_rule_has_a_test_where_it_fires() -> None:
    fired = set()
    for path in RULE_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                if check.get("exp_alerts"):
                    fired.add(check["alertname"])
    assert fired == {rule["alert"] for rule in rules()}


def test_every_rule_says_what_happened_and_links_its_runbook_section() -> None:
    anchors = {slug(heading) for heading in re.findall(r"^#+ (.+)$", OPERATIONS.read_text(), re.M)}
    for rule in rules():
        notes = rule["annotations"]
        assert notes["summary"] and notes["description"], rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        page, _, anchor = notes["runbook_url"].partition("#")
        assert page == "docs/operations.md", rule["alert"]
        assert anchor == slug(rule["alert"]) and anchor in anchors, rule["alert"]


def test_the_example_scrape_config_is_valid_and_has_the_jobs_the_rules_assume(
    tmp_path: Path,
) -> None:
    config = yaml.safe_load(SCRAPE_CONFIG.read_text())
    assert {job["job_name"] for job in config["scrape_configs"]} == JOBS
    for job in config["scrape_configs"]:  # a token file of the test's own, for promtool's check
        if "authorization" in job:
            token = tmp_path / "token"
            token.write_text("a-token")
            job["authorization"]["credentials_file"] = str(token)
    config["rule_files"] = [str(RULES)]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    done = promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert done.returncode == 0, done.stdout + done.stderr
    for rule in rules():  # a job a rule names is one the config scrapes
        assert set(re.findall(r'job="([^"]+)"', rule["expr"])) <= JOBS, rule["alert"]


def slug(heading: str) -> str:
    """A Markdown heading's anchor, as GitHub makes it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_every_dashboard_panel_query_is_valid_promql(tmp_path: Path) -> None:
    queries = panel_queries()
    assert queries
    as_rules = {  # promtool parses a query as a recording rule's expression
        "groups": [
            {
                "name": "panels",
                "rules": [
                    {"record": f"panel:{n}", "expr": grafana_variables(query)}
                    for n, (_, query) in enumerate(queries)
                ],
            }
        ]
    }
    (tmp_path / "panels.yml").write_text(yaml.safe_dump(as_rules))
    done = promtool("check", "rules", str(tmp_path / "panels.yml"))
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_metric_the_rules_and_the_dashboard_query_is_one_the_code_serves() -> None:
    served = set(BY_NAME) | {"up"}
    queries = [rule["expr"] for rule in rules()] + [query for _, query in panel_queries()]
    for query in queries:
        for name in re.findall(r"\b(fsm_[a-z_]+|up)\b(?=\s*[\[{)]|\s*$|\s)", query):
            assert re.sub(r"_(bucket|sum|count)$", "", name) in served, (name, query)


def test_the_dashboard_shows_every_metric_the_code_serves() -> None:
    shown = " ".join(query for _, query in panel_queries())
    assert [name for name in BY_NAME if not re.search(rf"\b{name}(_bucket)?\b", shown)] == []
