"""Deterministic mock agents: scripted outputs for every state of the shipped definitions."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

OUTPUTS: dict[str, dict[str, Any]] = {
    # cto_build_project
    "ANALYZE_ISSUE": {"needsSpec": True, "complexity": "medium"},
    "WRITE_SPEC": {"specPath": "/app/workspace/specs/issue-spec.md"},
    "CREATE_PROJECT": {"projectPath": "/app/projects/sla-api"},
    "WRITE_CODE": {"filesCreated": ["src/index.ts", "src/routes/health.ts"], "buildSuccess": True},
    "RUN_TESTS": {"passed": True, "coverage": 87},
    "COMMIT_PUSH": {"commitHash": "3f9c2ab"},
    "DEPLOY_STAGING": {"stagingUrl": "https://staging.example.test"},
    "VERIFY_STAGING": {"verified": True},
    "DEPLOY_PROD": {"prodUrl": "https://example.test"},
    # cto_fix_bug
    "ANALYZE_BUG": {"reproduced": True},
    "LOCATE_CODE": {"location": "src/routes/health.ts:12"},
    "WRITE_FIX": {"filesChanged": ["src/routes/health.ts", "test/health.test.ts"]},
    "DEPLOY": {"deploymentUrl": "https://example.test"},
    # cto_infrastructure_check
    "CHECK_UPTIME": {"uptime": "7/7 services up"},
    "CHECK_CERTS": {"certs": "all valid for 60+ days"},
    "CHECK_CONTAINERS": {"containers": "12 running, 0 restarting"},
    "GENERATE_REPORT": {"report": "All systems nominal."},
}


@dataclass(frozen=True)
class Failure:
    """Make the n-th visits of a state fail (1-based), with this error text."""

    state: str
    visits: frozenset[int]
    error: str = "injected failure"


@dataclass
class MockAgent:
    """Answers state_task messages with scripted outputs; same seed, same run."""

    seed: int = 0
    outputs: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: OUTPUTS)
    failures: tuple[Failure, ...] = ()
    overrides: Mapping[tuple[str, int], Mapping[str, Any]] = field(default_factory=dict)
    _visits: Counter[tuple[str, str]] = field(default_factory=Counter)

    def think_seconds(self, task: Mapping[str, Any], low: float, high: float) -> float:
        """A deterministic pseudo-random work time for the task."""
        rng = random.Random(f"{self.seed}:{task['machineId']}:{task['attempt']}")
        return rng.uniform(low, high)

    def answer(self, task: Mapping[str, Any]) -> dict[str, Any]:
        """The state_ack for a state_task."""
        state = task["state"]
        key = (str(task["machineId"]), state)
        self._visits[key] += 1
        visit = self._visits[key]
        ack: dict[str, Any] = {
            "type": "state_ack",
            "machineId": task["machineId"],
            "state": state,
            "attempt": task["attempt"],
            "taskToken": task["taskToken"],
            "success": True,
            "output": dict(self.overrides.get((state, visit), self.outputs.get(state, {}))),
        }
        for failure in self.failures:
            if failure.state == state and visit in failure.visits:
                ack.update(success=False, output={}, error=failure.error)
        return ack
