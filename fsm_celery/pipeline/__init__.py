"""The research pipeline: Researcher → Analyzer → Reviewer with a bounded revision loop."""

from __future__ import annotations

from fsm_celery.pipeline.agents import AnalyzerAgent, ResearchAgent, ReviewerAgent
from fsm_celery.pipeline.orchestrator import AgentOrchestrator, pipeline_context
from fsm_celery.pipeline.state import Message, TaskState, TaskStatus

__all__ = [
    "AgentOrchestrator",
    "AnalyzerAgent",
    "Message",
    "ResearchAgent",
    "ReviewerAgent",
    "TaskState",
    "TaskStatus",
    "pipeline_context",
]
