"""Debian's Prometheus for the tests (package `prometheus`): promtool, which checks and unit-tests
the alert rules, and a real server of a test's own, on a free port, keeping its data in a
temporary folder, which scrapes a running deployment and evaluates the rules."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.support import ROOT
from tests.support.services import HOST, _die_with_parent, free_port

DEPLOY = ROOT / "deploy"
RULES = DEPLOY / "prometheus" / "alerts.yml"
RULE_TESTS = sorted((DEPLOY / "prometheus" / "tests").glob("*.yml"))
SCRAPE_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
GRAFANA = DEPLOY / "grafana" / "fsm-celery.json"
OPERATIONS = ROOT / "docs" / "operations.md"


def binary(name: str) -> str:
    """promtool or prometheus, installed (Debian: apt-get install prometheus), else fail loudly."""
    found = shutil.which(name) or next(
        (path for path in (f"/usr/bin/{name}", f"/usr/sbin/{name}") if Path(path).exists()), None
    )
    if found is None:
        raise RuntimeError(
            f"the alert tests need {name!r} and it is not installed: apt-get install prometheus "
            "(Debian's package has prometheus and promtool; .ci/run installs it)"
        )
    return found


def promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [binary("promtool"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def rules() -> list[dict[str, Any]]:
    """The alert rules of deploy/prometheus/alerts.yml, every group's."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def panel_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every query of the Grafana dashboard, rows' panels included."""
    dashboard = json.loads(GRAFANA.read_text())
    found: list[tuple[str, str]] = []
    for panel in dashboard["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            found += [(inner["title"], target["expr"]) for target in inner.get("targets", [])]
    return found


def grafana_variables(query: str, rate_interval: str = "1m") -> str:
    """A panel's query as Grafana sends it ($__rate_interval: four scrape intervals at least)."""
    return query.replace("$__rate_interval", rate_interval)


def quick_rules(directory: Path) -> Path:
    """A copy of the alert rules for a test of minutes: each `for:` a second, each range
    window of N minutes one of N seconds (the expressions and thresholds as they are)."""
    groups = yaml.safe_load(RULES.read_text())
    for group in groups["groups"]:
        for rule in group["rules"]:
            rule["expr"] = re.sub(r"\[(\d+)m\]", r"[\1s]", rule["expr"])
            if "for" in rule:
                rule["for"] = "1s"
    directory.mkdir(parents=True, exist_ok=True)
    copy = directory / "alerts.yml"
    copy.write_text(yaml.safe_dump(groups))
    return copy


@dataclass
class Prometheus:
    """A real `prometheus` of a test's own, scraping targets by job, evaluating rule files."""

    directory: Path
    process: subprocess.Popen[bytes]
    port: int

    @classmethod
    def start(
        cls,
        directory: Path,
        jobs: dict[str, list[str]],
        rule_files: list[Path],
        bearer: dict[str, str] | None = None,
    ) -> Prometheus:
        """jobs: job name → targets (host:port); bearer: job name → the token it sends."""
        directory.mkdir(parents=True, exist_ok=True)
        scrape = []
        for job, targets in jobs.items():
            config: dict[str, Any] = {"job_name": job, "static_configs": [{"targets": targets}]}
            if bearer and job in bearer:
                config["authorization"] = {"type": "Bearer", "credentials": bearer[job]}
            scrape.append(config)
        config_file = directory / "prometheus.yml"
        config_file.write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": [str(path) for path in rule_files],
                    "scrape_configs": scrape,
                }
            )
        )
        port = free_port()
        log = directory / "prometheus.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [
                    binary("prometheus"),
                    f"--config.file={config_file}",
                    f"--storage.tsdb.path={directory / 'data'}",
                    f"--web.listen-address={HOST}:{port}",
                    "--storage.tsdb.retention.time=1h",
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent(signal.SIGTERM),
            )
        server = cls(directory, process, port)
        try:
            server._wait_ready()
        except BaseException:
            server.stop()
            raise
        return server

    @property
    def log(self) -> str:
        return (self.directory / "prometheus.log").read_text(errors="replace")

    def _wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.process.returncode}:\n{self.log}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"prometheus did not become ready:\n{self.log[-3000:]}")
            time.sleep(0.1)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=10) as answer:
            body = json.load(answer)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector (or scalar, as one sample) the expression has now."""
        data = self.api("query", query=expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        result: list[dict[str, Any]] = data["result"]
        return result

    def query_range(self, expr: str, start: float, end: float) -> list[dict[str, Any]]:
        """The series the expression had from start to end (unix times), a point a second:
        what a Grafana panel over that range draws."""
        data = self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step="1")
        result: list[dict[str, Any]] = data["result"]
        return result

    def targets(self) -> dict[str, list[str]]:
        """Each job's targets' health (up, down, unknown)."""
        health: dict[str, list[str]] = {}
        for target in self.api("targets", state="active")["activeTargets"]:
            health.setdefault(target["labels"]["job"], []).append(target["health"])
        return health

    def firing(self) -> list[dict[str, Any]]:
        """The alerts firing now."""
        alerts: list[dict[str, Any]] = self.api("alerts")["alerts"]
        return [alert for alert in alerts if alert["state"] == "firing"]

    def wait_for(self, what: str, found: Any, timeout: float = 90.0) -> Any:
        """found() once it is truthy; AssertionError naming what after timeout seconds."""
        deadline = time.monotonic() + timeout
        while True:
            value = found()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {timeout:.0f} s")
            time.sleep(0.5)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
