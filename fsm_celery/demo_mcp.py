"""The embedded demo's coding agent over MCP: the agent door (fsm_celery.mcp.agent) as an agent
on the demo's in-memory bus, and a scripted coding agent that works its machine through the
door's tools with the `mcp` package's own client (a ClientSession on an in-memory transport),
as one would over stdio: next_task, heartbeat, submit. Its first RUN_TESTS answer breaks the
state's contract (`passed: "yes"`, as a model might write it): submit refuses it naming the
problem, and the corrected answer is the ack.

Imports `mcp`, an optional extra (`fsm-celery[mcp]`): the demo imports this module only when
it is installed, and runs without this part otherwise."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable
from typing import Any

import anyio
from mcp.client import Client, ClientSession

from fsm_celery.acks.memory import MemoryConsumer
from fsm_celery.agent.mock import OUTPUTS
from fsm_celery.agent.sdk import Failed, HandBack
from fsm_celery.agent.task import Task, reply
from fsm_celery.channel.memory import MemoryBus
from fsm_celery.client import Client as FsmClient
from fsm_celery.core.messages import StateTask, parse_task_message, task_channel
from fsm_celery.mcp.agent import HandOff, agent_server
from fsm_celery.mcp.machine import MachineReads

AGENT_TYPE = "cto"
WAIT = 0.5  # seconds each next_task waits: how soon the client sees the demo end
WRONG_FIRST = {"RUN_TESTS": {"passed": "yes", "coverage": 87}}  # a boolean written as text
THINK = 0.1  # seconds the scripted coding agent works on a task
# a line the demo shows under the machine's name, before the step that ends the attempt
Note = Callable[[tuple[uuid.UUID, int, str]], None]


class McpRun:
    """The door's agent on the bus, and the scripted coding agent on a thread of its own."""

    def __init__(
        self, bus: MemoryBus, prefix: str, acks: MemoryConsumer, fsm: FsmClient, note: Note
    ) -> None:
        self.agent_id = uuid.uuid4()
        self.acks = acks
        self.note = note
        self.handoff = HandOff()
        self.server = agent_server(self.handoff, AGENT_TYPE, MachineReads(fsm))
        self.stopping = threading.Event()
        self.working = threading.Thread(target=anyio.run, args=(self._work,), daemon=True)
        # the bus calls a listener with one message at a time: the door's concurrency of 1
        bus.subscribe(task_channel(str(self.agent_id), prefix), self._park)

    def start(self) -> None:
        self.working.start()

    def stop(self) -> None:
        self.stopping.set()
        self.working.join(5)

    def _send(self, message: dict[str, Any]) -> None:
        self.acks.put(json.dumps(message), self.agent_id)

    def _park(self, raw: str) -> None:
        """Park the task for the MCP session (the door's handler), then send what it said."""
        message = parse_task_message(raw)
        if not isinstance(message, StateTask):
            return
        try:
            output = self.handoff.handle(Task(message, self._send))
        except Failed as failed:
            self._send(reply(message, "state_ack", success=False, output={}, error=str(failed)))
            return
        except HandBack as handed:
            self._send(reply(message, "state_handback", reason=str(handed)))
            return
        self._send(reply(message, "state_ack", success=True, output=dict(output)))

    async def _work(self) -> None:
        """The scripted coding agent: take each task, say it works on it, answer it."""
        async with Client(self.server, mode="legacy") as client:
            session = client.session
            refused: set[tuple[str, str]] = set()
            while not self.stopping.is_set():
                task = (await _call(session, "next_task", wait_seconds=WAIT))["task"]
                if task is None:
                    continue
                mid, state = uuid.UUID(task["machine_id"]), task["state"]
                await _call(session, "heartbeat", progress=f"working on {state}")
                await anyio.sleep(THINK)
                if state in WRONG_FIRST and (task["machine_id"], state) not in refused:
                    refused.add((task["machine_id"], state))
                    answer = await _call(session, "submit", output=WRONG_FIRST[state])
                    problems = "; ".join(answer.get("problems", []))
                    text = f"submit refused over MCP: {problems}; corrected"
                    self.note((mid, task["attempt"], f"[yellow]MCP [/] {state:>15}    {text}"))
                await _call(session, "submit", output=dict(OUTPUTS.get(state, {})))


async def _call(session: ClientSession, tool: str, /, **arguments: Any) -> dict[str, Any]:
    """A door tool's structured answer."""
    result = await session.call_tool(tool, arguments)
    if result.is_error:
        raise RuntimeError(" ".join(getattr(block, "text", "") for block in result.content))
    return dict(result.structured_content or {})
