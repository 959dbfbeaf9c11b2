"""Running agents from the command line: the mock agents, or a user's own."""

from __future__ import annotations

import importlib
import logging
import signal
import threading
import uuid
from collections.abc import Iterable

from fsm_celery.agent.mock import MockScript, serve_mock
from fsm_celery.agent.pipeline import serve_pipeline
from fsm_celery.agent.sdk import Agent
from fsm_celery.config import Settings
from fsm_celery.core.loader import definition_files, load_all
from fsm_celery.pipeline.orchestrator import PIPELINE

log = logging.getLogger(__name__)

AGENT_NAMESPACE = uuid.UUID("5d0f7b1c-9c39-4a8e-8c55-0f8b7f4b2a61")


def mock_agents(
    settings: Settings,
    script: MockScript,
    agent_types: Iterable[str] = (),
    agent_id: uuid.UUID | None = None,
    concurrency: int = 4,
) -> list[Agent]:
    """One mock agent per agent type the definitions name, their states' and children's
    included (or per type asked for)."""
    definitions = load_all(definition_files(settings.definitions))
    types = sorted(set(agent_types) or {t for d in definitions for t in d.agent_types_named()})
    if agent_id is not None and len(types) != 1:
        raise ValueError("--agent-id needs exactly one --agent-type")
    serves_pipeline = {t for d in definitions if d.type == PIPELINE for t in d.agent_types_named()}
    made = []
    for agent_type in types:
        agent = Agent(
            agent_type,
            redis_url=settings.redis_url,
            agent_id=agent_id or uuid.uuid5(AGENT_NAMESPACE, f"mock:{script.seed}:{agent_type}"),
            concurrency=concurrency,
            prefix=settings.channel_prefix,
            replicas=settings.redis_replicas,
            replica_timeout_ms=settings.redis_replica_timeout_ms,
        )
        serve_mock(agent, script)
        if agent_type in serves_pipeline:
            serve_pipeline(agent)  # the pipeline's own agents, in mock mode
        made.append(agent)
    return made


def llm_agents(
    settings: Settings,
    agent_types: Iterable[str] = (),
    agent_id: uuid.UUID | None = None,
    concurrency: int = 4,
) -> list[Agent]:
    """One agent per agent type (those asked for, else every type the definitions name) whose
    every state a chat model answers (fsm_celery.agent.llm)."""
    from fsm_celery.agent.llm import LlmHandler, serve_llm

    handler = LlmHandler(settings)
    types = sorted(set(agent_types) or _named_types(settings))
    if agent_id is not None and len(types) != 1:
        raise ValueError("--agent-id needs exactly one --agent-type")
    made = []
    for agent_type in types:
        agent = Agent(
            agent_type,
            redis_url=settings.redis_url,
            agent_id=agent_id,  # else the URL's credentials', else a new one
            concurrency=concurrency,
            prefix=settings.channel_prefix,
            replicas=settings.redis_replicas,
            replica_timeout_ms=settings.redis_replica_timeout_ms,
        )
        serve_llm(agent, handler)
        made.append(agent)
    return made


def _named_types(settings: Settings) -> set[str]:
    definitions = load_all(definition_files(settings.definitions))
    return {t for d in definitions for t in d.agent_types_named()}


def user_agents(path: str) -> list[Agent]:
    """The Agent, or the list of Agents (one per agent type, say), named by module:attribute."""
    module_name, _, attribute = path.partition(":")
    if not module_name:
        raise ValueError(f"--app {path!r}: expected module:attribute (e.g. myagents:agent)")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"--app {path!r}: cannot import {module_name!r}: {exc}") from exc
    found = getattr(module, attribute or "agent", None)
    if found is None:
        raise ValueError(f"--app {path!r}: {module_name} has no attribute {attribute or 'agent'!r}")
    agents = list(found) if isinstance(found, list | tuple) else [found]
    if not agents or not all(isinstance(a, Agent) for a in agents):
        kind = type(found).__name__
        raise ValueError(f"--app {path!r} is a {kind}, not an fsm_celery Agent or a list of them")
    return agents


def run(*agents: Agent) -> None:
    """Run the agents in this process until SIGTERM or SIGINT (docs/agents.md)."""
    run_agents(list(agents))


def run_agents(agents: list[Agent]) -> None:
    """Run the agents until SIGTERM or SIGINT; each finishes or hands back its tasks. An agent
    that died of an error makes the process exit with status 1 once the others stopped (never
    0: a supervisor restarts what failed), the others told to stop at once."""
    failed: list[Agent] = []

    def serve(agent: Agent) -> None:
        try:
            agent.run(install_signals=False)
        except Exception:
            log.exception("agent %s stopped on an error", agent.id)
            failed.append(agent)
            stop()

    def stop(*_: object) -> None:
        for agent in agents:
            agent.stop()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    threads = [threading.Thread(target=serve, args=(a,)) for a in agents]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failed:
        raise SystemExit(1)
