"""docs/operations.md's scrape jobs are a configuration Prometheus accepts (Debian's promtool
checks it), under the job names the alert rules are written against."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

from fsm_celery.metrics.reference import OPERATIONS

JOBS = {"fsm-worker", "fsm-beat", "fsm-bridge", "fsm-agent", "fsm-dashboard"}


def scrape_block() -> str:
    """The page's yaml block of scrape_configs."""
    blocks = OPERATIONS.read_text().split("```yaml\n")[1:]
    found = [b.split("```", 1)[0] for b in blocks if b.startswith("scrape_configs:")]
    assert len(found) == 1, "docs/operations.md should hold one scrape_configs block"
    return found[0]


def test_the_scrape_jobs_are_those_the_alert_rules_name() -> None:
    jobs = yaml.safe_load(scrape_block())["scrape_configs"]
    assert {job["job_name"] for job in jobs} == JOBS
    dashboard = next(job for job in jobs if job["job_name"] == "fsm-dashboard")
    assert "credentials_file" in dashboard["authorization"]  # its /metrics asks for a token


def test_promtool_accepts_the_scrape_configuration(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool is needed (Debian's prometheus package)"
    config = tmp_path / "prometheus.yml"
    config.write_text(scrape_block())
    (tmp_path / "fsm-metrics-token").write_text("a-token\n")
    checked = subprocess.run(
        [promtool, "check", "config", str(config)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
