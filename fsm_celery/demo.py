"""The embedded demo: SQLite, an in-process Celery worker, in-process mock agents, and the ack
bridge's own loop reading their acks from memory (the inline mode).

The CTO machines are pinned to one of two agents (`steady`, and `shaky`, which fails on cue);
the research machines, and the children of fan-outs, go to their states' agent types, each served
by a mock agent of its own as agents of a type are in production. A second research pipeline is
pinned to the LLM agent (fsm_celery.agent.llm), asking the demo's own scripted chat endpoint
(fsm_celery.agent.scripted_llm), whose first answer to each state breaks its contract and is
corrected. A second bug fix is worked through the MCP agent door by a scripted coding agent
(fsm_celery.demo_mcp), when the `mcp` extra is installed."""

from __future__ import annotations

import json
import logging
import queue
import secrets
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from fsm_celery import wiring
from fsm_celery.acks.bridge import Bridge, applied_here
from fsm_celery.acks.memory import MemoryConsumer
from fsm_celery.agent.llm import LlmHandler
from fsm_celery.agent.mock import MockScript
from fsm_celery.agent.scripted_llm import Script, Served
from fsm_celery.agent.sdk import Failed
from fsm_celery.agent.task import Task, reply
from fsm_celery.channel.memory import MemoryBus
from fsm_celery.client import Client
from fsm_celery.config import Settings, TransitionMode
from fsm_celery.core.loader import definition_files, load_all
from fsm_celery.core.messages import StateTask, parse_task_message, task_channel
from fsm_celery.core.parking import Policy
from fsm_celery.engine import MachineEngine
from fsm_celery.exceptions import FsmError
from fsm_celery.pipeline.orchestrator import PIPELINE, as_node, default_agents, pipeline_context
from fsm_celery.pipeline.state import TaskState
from fsm_celery.records import MachineInfo, TransitionRecord
from fsm_celery.store.db import upgrade

if TYPE_CHECKING:
    from fsm_celery.demo_mcp import McpRun

log = logging.getLogger(__name__)
# lines an agent shows under a machine's name, before the machine's step that ends the attempt
Notes = queue.Queue[tuple[uuid.UUID, int, str]]
TERMINAL = {"completed", "failed", "cancelled"}
THINK = (0.02, 0.15)  # seconds a mock agent works on a task
DEMO_APPROVER = "release-manager (demo)"
MCP_SKIPPED = "the MCP run is skipped: the mcp extra is missing"
STATUS_STYLE = {"completed": "green", "failed": "red", "cancelled": "yellow", "running": "cyan"}


def run_demo(
    definitions: str | Path, console: Console | None = None, timeout: float = 60.0
) -> bool:
    """Run a machine of every shipped definition to its end with mock agents, showing their
    progress live and a summary; True when all of them finished."""
    console = console or Console()
    from celery.contrib.testing.worker import start_worker

    from fsm_celery.worker.app import app

    with tempfile.TemporaryDirectory(prefix="fsm-celery-demo-") as folder:
        settings = Settings(
            database_url=f"sqlite:///{Path(folder) / 'demo.sqlite3'}",
            broker_url="memory://localhost/",
            task_token_secret=secrets.token_hex(16),
            definitions_path=str(definitions),
            transition_mode=TransitionMode.INLINE,  # its bridge applies the acks (below)
        )
        app.conf.update(
            broker_url="memory://localhost/",
            broker_transport_options={"polling_interval": 0.01},
            task_default_queue=settings.queue,
        )
        bus = MemoryBus(settings.channel_prefix)
        engine = wiring.machine_engine(settings, dispatcher=bus)
        upgrade(engine.db)
        wiring.provide_worker(settings, engine)
        client = wiring.client(settings, engine)
        loaded = client.load_definitions()
        console.print(
            "loaded "
            + ", ".join(f"{machine_type} v{version}" for machine_type, version, _ in loaded),
            soft_wrap=True,
        )
        # the ack bridge, as in production in the inline mode, reading from memory
        acks = MemoryConsumer()
        bridge = Bridge(
            [acks],
            applied_here(wiring.inline_applier(settings, engine)),
            Policy(settings.dead_letter_after),
        )
        serving = threading.Event()
        bridging = threading.Thread(target=bridge.run, args=(serving,), daemon=True)
        bridging.start()
        steady = _agent(bus, settings, MockScript(seed=7, think=THINK), acks)
        _serve_agent_types(bus, settings, acks, client)
        shaky = _agent(
            bus,
            settings,
            MockScript(
                seed=7,
                think=THINK,
                overrides={("ANALYZE_ISSUE", 1): {"needsSpec": False, "complexity": "low"}},
                failures={"RUN_TESTS": frozenset({1})},
            ),
            acks,
        )
        endpoint = Served(Script(bad_first=True))  # the demo's chat model, scripted
        with (
            endpoint,
            start_worker(
                app, pool="threads", concurrency=2, perform_ping_check=False, loglevel="WARNING"
            ),
        ):
            llm = _llm_agent(bus, settings, acks, endpoint.url)
            notes: Notes = queue.Queue()
            coding = _mcp_run(bus, settings, acks, client, notes, console)
            ids = _start_machines(client, steady, shaky, llm, coding)
            scanning = threading.Event()
            scanner = threading.Thread(target=_scan, args=(engine, scanning), daemon=True)
            scanner.start()  # timeouts and retry delays, as beat's scan does in production
            approving = threading.Thread(target=_approver, args=(client, scanning), daemon=True)
            approving.start()  # a person of the release group, scripted
            done = _follow(client, ids, console, timeout, notes)
            if coding is not None:
                coding.stop()
            scanning.set()
            scanner.join(5)
            approving.join(5)
        serving.set()
        bridging.join(5)
        bus.close()
        engine.db.dispose()
        return done


def _scan(engine: MachineEngine, stop: threading.Event) -> None:
    while not stop.wait(0.5):
        engine.scan.run()


def _approver(client: Client, stop: threading.Event) -> None:
    """A scripted person of the release group: approves each gate waiting, after a moment's
    reading, through the client (as `fsm-celery approve` or the dashboard would)."""
    while not stop.wait(0.2):
        for waiting in client.approvals():
            if waiting["status"] != "running" or stop.wait(0.3):
                continue
            try:
                client.decide(
                    waiting["machine_id"],
                    "approve",
                    DEMO_APPROVER,
                    fields={"note": "staging verified; ship it"},
                    comment="the demo's scripted approver",
                    via="client",
                    attempt=waiting["attempt"],
                )
            except FsmError as exc:  # the gate closed meanwhile (its deadline, say)
                log.info("the demo's approver was refused: %s", exc)


def _mcp_run(
    bus: MemoryBus,
    settings: Settings,
    acks: MemoryConsumer,
    client: Client,
    notes: Notes,
    console: Console,
) -> McpRun | None:
    """The MCP door's agent and its scripted coding agent, started; None (said) without the
    `mcp` extra."""
    try:
        from fsm_celery.demo_mcp import McpRun
    except ImportError as exc:
        console.print(
            f"{MCP_SKIPPED} ({exc}): pip install 'fsm-celery[mcp]'",
            soft_wrap=True,
            markup=False,
        )
        return None
    run = McpRun(bus, settings.channel_prefix, acks, client, notes.put)
    run.start()
    return run


def _start_machines(
    client: Client, steady: uuid.UUID, shaky: uuid.UUID, llm: uuid.UUID, coding: McpRun | None
) -> list[uuid.UUID]:
    """A machine of every shipped definition, a second build that meets a failure, a second
    research pipeline worked by the LLM agent, and a second bug fix worked over MCP."""
    started = [
        client.start_machine(  # its production deploy waits for a person's approval
            "cto_build_project",
            {"projectName": "sla-api", "githubIssue": 726, "approveProduction": True},
            steady,
        ),
        client.start_machine(
            "cto_build_project", {"projectName": "status-page", "githubIssue": 731}, shaky
        ),
        client.start_machine("cto_fix_bug", {"projectName": "sla-api", "githubIssue": 740}, steady),
        client.start_machine("cto_infrastructure_check", {}, steady),
        client.start_machine(  # its researcher, analyzer and reviewer: three agent types
            PIPELINE, pipeline_context(TaskState(query="durable workflows for AI agents"))
        ),
        client.start_machine(
            "cto_build_parallel", {"projectName": "docs-site", "githubIssue": 744}, steady
        ),
        client.start_machine("research_fanout", {"query": "durable workflows for AI agents"}),
        client.start_machine(  # every state asked of a chat model (the demo's, scripted)
            PIPELINE, pipeline_context(TaskState(query="state machines for LLM agents")), llm
        ),
    ]
    if coding is not None:  # every state taken and answered through the MCP door's tools
        context = {"projectName": "status-page", "githubIssue": 752}
        started.append(client.start_machine("cto_fix_bug", context, coding.agent_id))
    return started


def _serve_agent_types(
    bus: MemoryBus, settings: Settings, acks: MemoryConsumer, client: Client
) -> None:
    """A mock agent for every agent type the definitions name, listening where the tasks of
    unassigned machines of the type go: machines started for no agent, and fan-outs' children."""
    definitions = load_all(definition_files(settings.definitions))
    for agent_type in sorted({t for d in definitions for t in d.agent_types_named()}):
        agent_id = _agent(bus, settings, MockScript(seed=7, think=THINK), acks, agent_type)
        client.register_agent(agent_id, agent_type)  # an unassigned task's ack is checked by type


def _agent(
    bus: MemoryBus,
    settings: Settings,
    mock: MockScript,
    acks: MemoryConsumer,
    agent_type: str | None = None,
) -> uuid.UUID:
    """A mock agent listening on its own channel, and on its type's (where unassigned tasks of
    the type go) when it serves one."""
    agent_id = uuid.uuid4()
    research = {state: as_node(agent) for state, agent in default_agents().items()}

    def handle(message: str) -> None:
        task = json.loads(message)
        time.sleep(mock.think_seconds(task["machineId"], task["attempt"]))
        ack = mock.answer(task)
        if task["machineType"] == PIPELINE and task["state"] in research:
            ack["output"] = research[task["state"]](task["context"])  # the research agents
        acks.put(json.dumps(ack), agent_id)

    bus.subscribe(task_channel(str(agent_id), settings.channel_prefix), handle)
    if agent_type is not None:
        bus.subscribe(task_channel(agent_type, settings.channel_prefix), handle)
    return agent_id


def _llm_agent(bus: MemoryBus, settings: Settings, acks: MemoryConsumer, url: str) -> uuid.UUID:
    """The LLM agent on its own channel, asking the chat endpoint at `url` (its heartbeats and
    acks read by the bridge as any agent's)."""
    agent_id = uuid.uuid4()
    handler = LlmHandler(settings.model_copy(update={"llm_base_url": url, "llm_model": "scripted"}))

    def send(message: dict[str, Any]) -> None:
        acks.put(json.dumps(message), agent_id)

    def handle(raw: str) -> None:
        message = parse_task_message(raw)
        if not isinstance(message, StateTask):
            return
        try:
            output = handler(Task(message, send), "llm")
        except Failed as failed:
            send(
                reply(message, "state_ack", success=False, output=failed.output, error=str(failed))
            )
            return
        send(reply(message, "state_ack", success=True, output=output))

    bus.subscribe(task_channel(str(agent_id), settings.channel_prefix), handle)
    return agent_id


def _follow(
    client: Client, ids: list[uuid.UUID], console: Console, timeout: float, notes: Notes
) -> bool:
    """Print each transition as it is recorded (and each line an agent notes), under a live
    table of the machines; then the summary. Without a terminal, rich prints the lines and the
    tables once, unanimated."""
    names = {mid: f"{client.get_machine(mid).type}#{n}" for n, mid in enumerate(ids, 1)}
    shown = dict.fromkeys(ids, 0)
    started = time.monotonic()
    ended: dict[uuid.UUID, float] = {}
    machines: list[MachineInfo] = []
    with Live(console=console, auto_refresh=False, transient=True) as live:

        def show(mid: uuid.UUID, text: str) -> None:
            live.console.print(
                f"{time.monotonic() - started:6.2f}s  {names[mid]:28} {text}",
                highlight=False,
                soft_wrap=True,  # a line per transition, however narrow the terminal
            )

        noted: dict[uuid.UUID, list[tuple[int, str]]] = {mid: [] for mid in ids}
        while time.monotonic() - started < timeout:
            histories = {mid: client.history(mid) for mid in ids}
            while not notes.empty():  # after the reads: a row's notes are in by its read
                mid, attempt, text = notes.get()
                noted[mid].append((attempt, text))
            for mid, rows in histories.items():
                lines, noted[mid] = _lines(rows[shown[mid] :], noted[mid])
                for line in lines:
                    show(mid, line)
                shown[mid] = len(rows)
            machines = [client.get_machine(mid) for mid in ids]
            for m in machines:
                if m.status in TERMINAL:
                    ended.setdefault(m.id, time.monotonic() - started)
            live.update(_table(machines, names, shown, ended, started), refresh=True)
            if all(m.status in TERMINAL for m in machines):
                break
            time.sleep(0.05)
    console.print(_table(machines, names, shown, ended, started, title="Summary"))
    done = all(m.status in TERMINAL for m in machines)
    if not done:
        console.print(f"[red]the demo timed out after {timeout:.0f}s[/]")
    return done


def _lines(
    rows: list[TransitionRecord], noted: list[tuple[int, str]]
) -> tuple[list[str], list[tuple[int, str]]]:
    """A machine's new history rows as lines, each after the notes of its attempt (and of the
    ones before); and the notes still waiting for their row."""
    lines: list[str] = []
    for row in rows:
        lines += [text for attempt, text in noted if attempt <= row.attempt]
        noted = [(attempt, text) for attempt, text in noted if attempt > row.attempt]
        lines.append(_step(row))
    return lines, noted


def _step(row: TransitionRecord) -> str:
    """A transition as the demo prints it: ok or FAIL, its states, and why in a few words."""
    mark = "[green]ok  [/]" if row.success else "[red]FAIL[/]"
    note = f"  ({row.error_message})" if row.error_message else ""
    if row.event == "join" and row.success:
        note = f"  (joined: {_joined(row.output or {})})"
    if row.event == "approval":
        verdict = "approved" if row.success else "rejected"
        note = f"  ({verdict} by {row.actor})"
    return f"{mark} {row.from_state or '(start)':>15} -> {row.to_state}{note}"


def _joined(output: dict[str, Any]) -> str:
    """What a join handed its machine, in a few words: a map's count of results (and of the
    children that failed, whose slots hold their errors), or the branches' names."""
    return ", ".join(
        _counted(key, value) if isinstance(value, list) else key for key, value in output.items()
    )


def _counted(key: str, results: list[Any]) -> str:
    failed = sum(
        1
        for r in results
        if isinstance(r, dict)
        and r.get("status") in ("failed", "cancelled")
        and set(r) <= {"status", "error"}
    )
    return f"{len(results)} {key}" + (f", {failed} failed" if failed else "")


def _table(
    machines: list[MachineInfo],
    names: dict[uuid.UUID, str],
    shown: dict[uuid.UUID, int],
    ended: dict[uuid.UUID, float],
    started: float,
    title: str = "Machines",
) -> Table:
    table = Table(title=title)
    for column in ("machine", "state", "status", "transitions", "tokens", "seconds"):
        table.add_column(
            column, justify="right" if column in ("transitions", "tokens", "seconds") else "left"
        )
    for m in machines:
        seconds = ended.get(m.id, time.monotonic() - started)
        table.add_row(
            names[m.id],
            m.current_state,
            f"[{STATUS_STYLE.get(m.status, 'white')}]{m.status}[/]",
            str(max(shown[m.id] - 1, 0)),
            str(m.tokens_used),
            f"{seconds:.2f}",
        )
    return table
