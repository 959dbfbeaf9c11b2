"""The pipeline's agents: process(state) -> state, deterministic in mock mode.

Each agent returns a new TaskState and leaves the one it was given untouched. With `llm` set
(a function from prompt to text) the agents ask it; without, they run in mock mode and produce
the same text for the same state every time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

from fsm_celery.pipeline.state import TaskState, TaskStatus

Llm = Callable[[str], str]


class PipelineAgent(Protocol):
    """Anything with a name and process(state) -> state."""

    name: str

    def process(self, state: TaskState) -> TaskState: ...


def _digest(*parts: object) -> str:
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:8]


class _Asking:
    """An agent that asks `llm` when it is given one, else runs in mock mode."""

    def __init__(self, llm: Llm | None = None) -> None:
        self.llm = llm


class IntakeAgent:
    """Accepts a task: the query must say something."""

    name = "intake"

    def process(self, state: TaskState) -> TaskState:
        if not state.query.strip():
            raise ValueError("the query is empty")
        return replace(
            state,
            status=TaskStatus.PENDING,
            messages=state.said(self.name, f"accepted: {state.query}"),
        )


class ResearchAgent(_Asking):
    """Gathers findings and sources for the query."""

    name = "researcher"

    def process(self, state: TaskState) -> TaskState:
        if self.llm is not None:
            findings = [line for line in self.llm(f"Research: {state.query}").splitlines() if line]
        else:
            key = _digest("research", state.query)
            findings = [f"finding {n} on {state.query} [{key}]" for n in (1, 2, 3)]
        sources = [f"source-{_digest(f)}" for f in findings]
        return replace(
            state,
            status=TaskStatus.RESEARCHING,
            findings=findings,
            sources=sources,
            messages=state.said(self.name, f"{len(findings)} findings"),
        )


class AnalyzerAgent(_Asking):
    """Writes the analysis of the findings, revising it after the reviewer's feedback."""

    name = "analyzer"

    def process(self, state: TaskState) -> TaskState:
        iteration = state.iteration + 1
        revising = f" Revised after: {state.feedback}" if state.feedback else ""
        prompt = f"Analyse for '{state.query}': {'; '.join(state.findings)}.{revising}"
        analysis = (
            self.llm(prompt)
            if self.llm is not None
            else (
                f"Analysis v{iteration} of {len(state.findings)} findings on {state.query}."
                f"{revising} [{_digest(prompt)}]"
            )
        )
        after = replace(
            state,
            status=TaskStatus.ANALYZING,
            analysis=analysis,
            iteration=iteration,
            approved=False,
        )
        return replace(after, messages=after.said(self.name, f"analysis v{iteration}"))


class ReviewerAgent(_Asking):
    """Approves the analysis or sends it back with feedback.

    In mock mode it rejects the first `metadata["rejections"]` reviews of a task (0 when unset),
    so a test or a demo chooses how many revisions a run goes through.
    """

    name = "reviewer"

    def process(self, state: TaskState) -> TaskState:
        if self.llm is not None:
            verdict = self.llm(f"Review (answer APPROVE or feedback): {state.analysis}")
            approved = verdict.strip().upper().startswith("APPROVE")
        else:
            approved = state.iteration > int(state.metadata.get("rejections", 0))
            verdict = "APPROVE" if approved else f"needs more depth (review {state.iteration})"
        after = replace(
            state,
            status=TaskStatus.REVIEWING,
            approved=approved,
            feedback="" if approved else verdict,
        )
        return replace(after, messages=after.said(self.name, verdict))
