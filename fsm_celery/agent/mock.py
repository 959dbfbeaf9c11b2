"""Deterministic mock agents: scripted outputs for every state of the shipped definitions.

The same seed gives the same run: outputs are fixed per state (or, where they must follow the
task's input, computed from its context), failures are injected on chosen visits of a state, and
think times are drawn from (seed, machine, attempt).
"""

from __future__ import annotations

import hashlib
import random
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fsm_celery.agent.sdk import Agent, NoAck, Task

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
    # cto_build_parallel's branches
    "WRITE_TESTS": {"testFiles": ["test/health.test.ts"]},
    "WRITE_DOCS": {"docFiles": ["docs/health.md"]},
}

Computed = Callable[[Mapping[str, Any]], dict[str, Any]]

ASPECTS = (  # four sub-questions, so that a map three at a time makes one of them wait
    "What is known about",
    "Which methods exist for",
    "What are the open problems of",
    "Who uses",
)


def _digest(*parts: object) -> str:
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:8]


def split_query(context: Mapping[str, Any]) -> dict[str, Any]:
    """The analyzer's plan: one sub-question per aspect of the query."""
    return {"subQuestions": [f"{aspect} {context['query']}?" for aspect in ASPECTS]}


def research(context: Mapping[str, Any]) -> dict[str, Any]:
    """A researcher's answer to its one sub-question."""
    question = context["subQuestion"]
    key = _digest("research", context.get("query"), question)
    return {"finding": f"finding on {question!r} [{key}]", "sources": [f"source-{key}"]}


def analyse(context: Mapping[str, Any]) -> dict[str, Any]:
    """The analyzer's join: one analysis of the findings that came back, revised each visit."""
    revision = int(context.get("revision", 0)) + 1
    found = [f for f in context["findings"] if "finding" in f]
    text = f"Analysis v{revision} of {len(found)} findings on {context['query']}."
    return {"analysis": f"{text} [{_digest(text, *found)}]", "revision": revision}


def review(context: Mapping[str, Any]) -> dict[str, Any]:
    """The reviewer's verdict: an analysis is approved when any of its research came back."""
    approved = any("finding" in f for f in context.get("findings", ()))
    return {"approved": approved, "feedback": "" if approved else "no findings to analyse"}


# Outputs that follow the task's input, by (machine type, state): a child's type names its place.
COMPUTED: dict[tuple[str, str], Computed] = {
    ("research_fanout", "PLANNING"): split_query,
    ("research_fanout.RESEARCHING", "RESEARCH"): research,
    ("research_fanout", "ANALYZING"): analyse,
    ("research_fanout", "REVIEWING"): review,
}


class InjectedFailure(RuntimeError):
    """A failure the mock was told to produce."""


@dataclass
class MockScript:
    """What a mock agent answers: outputs per state, and the faults to inject."""

    seed: int = 0
    outputs: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: OUTPUTS)
    computed: Mapping[tuple[str, str], Computed] = field(default_factory=lambda: COMPUTED)
    failures: Mapping[str, frozenset[int]] = field(default_factory=dict)  # empty set: always
    slow: Mapping[str, float] = field(default_factory=dict)
    silent: frozenset[str] = frozenset()
    overrides: Mapping[tuple[str, int], Mapping[str, Any]] = field(default_factory=dict)
    think: tuple[float, float] = (0.0, 0.0)
    _visits: Counter[tuple[str, str]] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def think_seconds(self, machine_id: str, attempt: int) -> float:
        """A pseudo-random work time fixed by seed, machine and attempt."""
        low, high = self.think
        return random.Random(f"{self.seed}:{machine_id}:{attempt}").uniform(low, high)

    def respond(
        self,
        machine_id: str,
        state: str,
        machine_type: str = "",
        context: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The output for this visit of the state; raises InjectedFailure or NoAck when told."""
        with self._lock:
            self._visits[(machine_id, state)] += 1
            visit = self._visits[(machine_id, state)]
        if state in self.silent:
            raise NoAck
        failing = self.failures.get(state)
        if failing is not None and (not failing or visit in failing):
            raise InjectedFailure(f"injected failure in {state} (visit {visit})")
        override = self.overrides.get((state, visit))
        if override is not None:
            return dict(override)
        compute = self.computed.get((machine_type, state))
        if compute is not None:
            return compute(context or {})
        return dict(self.outputs.get(state, {}))

    def answer(self, task: Mapping[str, Any]) -> dict[str, Any]:
        """The state_ack for a state_task given as parsed JSON (used by the embedded demo)."""
        ack: dict[str, Any] = {
            "type": "state_ack",
            "machineId": task["machineId"],
            "state": task["state"],
            "attempt": task["attempt"],
            "taskToken": task["taskToken"],
        }
        try:
            return {
                **ack,
                "success": True,
                "output": self.respond(
                    task["machineId"], task["state"], task["machineType"], task["context"]
                ),
            }
        except InjectedFailure as exc:
            return {**ack, "success": False, "output": {}, "error": str(exc)}


def serve_mock(agent: Agent, script: MockScript) -> Agent:
    """Register the script as the agent's handler for every machine type and state."""

    @agent.handler()
    def handle(task: Task) -> Mapping[str, Any]:
        think = script.think_seconds(task.machine_id, task.attempt)
        if task.wait_cancelled(script.slow.get(task.state, 0.0) + think):
            raise NoAck  # the engine moved on: no visit, no answer
        return script.respond(task.machine_id, task.state, task.machine_type, task.context)

    return agent
