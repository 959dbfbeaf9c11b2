"""The MCP door for agents: `fsm-celery mcp agent`, an agent of one agent type whose work a
coding agent that speaks MCP (Claude Code, Codex CLI, Cursor …) does through tools.

It is an SDK `Agent` (agent/sdk.py), so the protocol is the SDK's: consumer groups, heartbeats,
cancels, hand-backs, replicated answers, statuses. Its one handler parks each task in a
hand-off (HandOff) and blocks until an MCP session answers it, or the attempt is dropped. A
session holds at most one task, and the tools act on the calling session's task only: no tool
takes a machine id or a token, so a session can answer no task but the one it took, and cannot
skip a step. Its resources too are the held task's: its context and output contract, and (read
from the database when the door is given one: machine.py) its machine's history and its
state's definition."""

from __future__ import annotations

import hmac
import json
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any
from urllib.parse import unquote, urlsplit

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp_types import ToolAnnotations
from pydantic import Field
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from fsm_celery.agent.sdk import Agent, Failed, HandBack, NoAck, Task
from fsm_celery.core.contract import flaws, schema_of
from fsm_celery.core.messages import StateTask
from fsm_celery.mcp.arguments import JsonObject
from fsm_celery.mcp.machine import MachineReads
from fsm_celery.mcp.serve import PATH, unauthorized
from fsm_celery.traces import span

WAIT_MOST = 60  # seconds next_task waits at the most: under the clients' request timeouts
CANCELLED = "the attempt was cancelled (paused, forced or timed out): call next_task"
NO_TASK = "this session holds no task: call next_task"
ANSWERED = "answered: call next_task for the next one"
TASK_URI = "fsm-celery://task/{part}"  # the held task's context, contract, history, definition
PARTS = ("context", "contract", "history", "definition")
FORGET_AFTER = 600.0  # seconds a cancelled task is kept to tell its session, at the least

WaitSeconds = Annotated[float, Field(ge=0, le=WAIT_MOST, description="seconds to wait for a task")]
Text = Annotated[str, Field(max_length=2000)]
NextWait = Annotated[
    float | None,
    Field(
        ge=0,
        le=WAIT_MOST,
        description="once accepted, wait up to this long for the next task and give it in the "
        "same answer (as next_task does): one call a state instead of two",
    ),
]
TAKE = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
END = ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False)


@dataclass(eq=False)
class Held:
    """A parked task and its answer, once a session gave one."""

    task: Task
    answered: threading.Event = field(default_factory=threading.Event)
    outcome: tuple[str, Any] = ("ack", {})
    dropped: float | None = None  # monotonic time the SDK dropped it (cancelled), if it did

    def answer(self, kind: str, value: Any) -> None:
        self.outcome = (kind, value)
        self.answered.set()


class HandOff:
    """Where the SDK's handler parks tasks until an MCP session takes and answers one."""

    def __init__(self) -> None:
        self.waiting: queue.Queue[Held] = queue.Queue()

    def handle(self, task: Task) -> Mapping[str, Any]:
        """The Agent's handler for every state: park the task, return what the session says."""
        held = Held(task)
        with span("mcp agent task", **{"fsm.state": task.state}):  # held for a session's answer
            self.waiting.put(held)
            while not held.answered.wait(0.1):
                if task.cancelled:
                    held.dropped = time.monotonic()
                    raise NoAck  # dropped by the SDK: nothing is sent
        kind, value = held.outcome
        if kind == "fail":
            raise Failed(value)
        if kind == "hand_back":
            raise HandBack(value)
        return dict(value)

    def take(self, seconds: float) -> Held | None:
        """The next task still worth working on, waiting up to `seconds`."""
        deadline = time.monotonic() + seconds
        while True:
            try:
                held = self.waiting.get(timeout=max(deadline - time.monotonic(), 0.001))
            except queue.Empty:
                return None
            if not held.task.cancelled:
                return held


def contract(task: StateTask) -> dict[str, Any]:
    """The output contract of the task's state, as a JSON Schema (the engine's: its
    output_schema with its required_output merged in; any object when it declares neither)."""
    return schema_of(task.output_schema, task.required_output) or {"type": "object"}


def problems(schema: Mapping[str, Any], output: Mapping[str, Any]) -> list[str]:
    """What is wrong with `output` against the schema as the engine finds it, each as
    "pointer: message" (the output itself is "/"), at most MAX_PROBLEMS."""
    return [f"{f.pointer or '/'}: {f.message}" for f in flaws(schema, output)]


def task_view(task: StateTask) -> dict[str, Any]:
    """What next_task shows of a task."""
    return {
        "machine_id": str(task.machine_id),
        "machine_type": task.machine_type,
        "state": task.state,
        "attempt": task.attempt,
        "prompt": task.prompt,
        "context": task.context,
        "output_contract": contract(task),
        "deadline": task.deadline.isoformat(),
    }


def held_view(held: Held) -> dict[str, Any]:
    """What next_task shows of a held task: with, when the engine refused its last answer
    (a contract of its own), the problems it named."""
    return {**task_view(held.task.message), "problems": list(held.task.problems)}


class Sessions:
    """The task each MCP session holds (the session is the MCP session: over HTTP, its id)."""

    def __init__(self, handoff: HandOff) -> None:
        self.handoff = handoff
        self.lock = threading.Lock()
        self.held: dict[str, Held] = {}

    def current(self, session: str) -> tuple[Held | None, str | None]:
        """The session's task, or None and why: a cancelled attempt is reported once, dropped."""
        with self.lock:
            held = self.held.get(session)
            if held is not None and held.task.cancelled:
                del self.held[session]
                return None, CANCELLED
        return held, None if held is not None else NO_TASK

    def hold(self, session: str, held: Held) -> None:
        """The session holds the task now; the tasks of sessions gone quiet for FORGET_AFTER
        since theirs was cancelled are forgotten (an HTTP session that ended without a word
        would keep its entry for as long as the door runs)."""
        now = time.monotonic()
        with self.lock:
            gone = [s for s, h in self.held.items() if h.dropped and now - h.dropped > FORGET_AFTER]
            for quiet in gone:
                del self.held[quiet]
            self.held[session] = held

    def release(self, session: str, held: Held) -> bool:
        """Whether the session still held the task (it gives it up now)."""
        with self.lock:
            if self.held.get(session) is not held:
                return False
            del self.held[session]
            return True


def _session(ctx: Context) -> str:
    """The calling MCP session: over HTTP its id (the session manager routes a request to the
    session its id names, and refuses an unknown one); over stdio the process's one session."""
    headers = ctx.headers
    return "stdio" if headers is None else str(headers.get("mcp-session-id", ""))


class _Tools:
    """The door's tools, each acting on the calling session's task."""

    def __init__(self, sessions: Sessions, machines: MachineReads) -> None:
        self.sessions = sessions
        self.machines = machines

    def all(self) -> list[tuple[Callable[..., Any], ToolAnnotations]]:
        return [
            (self.next_task, TAKE),
            (self.heartbeat, TAKE),
            (self.submit, END),
            (self.fail, END),
            (self.hand_back, END),
        ]

    def next_task(self, ctx: Context, wait_seconds: WaitSeconds = 0) -> dict[str, Any]:
        """Take the next task of this agent (waiting up to wait_seconds), or the one this
        session holds: its machine, state, prompt, context, output contract and deadline."""
        held, why = self.sessions.current(_session(ctx))
        if why == CANCELLED:
            return {"task": None, "cancelled": CANCELLED}
        if held is None:
            held = self.sessions.handoff.take(wait_seconds)
            if held is None:
                return {"task": None, "message": f"no task within {wait_seconds:g} s: call again"}
            self.sessions.hold(_session(ctx), held)
        return {"task": held_view(held)}

    def heartbeat(self, ctx: Context, progress: Text = "") -> dict[str, Any]:
        """Say the held task is being worked on, with progress text shown on the machine."""
        held, why = self.sessions.current(_session(ctx))
        if held is None:
            return {"sent": False, "message": why}
        held.task.progress(progress)
        return {"sent": True}

    def submit(
        self, ctx: Context, output: JsonObject, next_wait_seconds: NextWait = None
    ) -> dict[str, Any]:
        """Answer the held task with its output: checked against its output contract; the
        problems come back to be fixed, and the task stays held, until it matches. With
        next_wait_seconds, an accepted answer also takes the next task: `next` is what
        next_task(wait_seconds=next_wait_seconds) gives."""
        held, why = self.sessions.current(_session(ctx))
        if held is None:
            return {"accepted": False, "message": why}
        found = problems(contract(held.task.message), output)
        if found:
            return {"accepted": False, "problems": found}
        answered = self._answer(ctx, held, "ack", output)
        if next_wait_seconds is None or not answered["accepted"]:
            return answered
        return {**answered, "next": self.next_task(ctx, next_wait_seconds)}

    def fail(self, ctx: Context, error: Text) -> dict[str, Any]:
        """Answer the held task as failed (the state's retries and failure edges decide)."""
        held, why = self.sessions.current(_session(ctx))
        if held is None:
            return {"accepted": False, "message": why}
        return self._answer(ctx, held, "fail", error)

    def hand_back(self, ctx: Context, reason: Text) -> dict[str, Any]:
        """Give the held task back: sent again at once, without counting a retry."""
        held, why = self.sessions.current(_session(ctx))
        if held is None:
            return {"accepted": False, "message": why}
        return self._answer(ctx, held, "hand_back", reason)

    def held_task(self, ctx: Context, part: str) -> str:
        """The held task's `context`, output `contract`, its machine's `history` or its
        state's `definition`, as JSON."""
        if part not in PARTS:
            raise ValueError(f"part: expected one of {', '.join(PARTS)}, got {part!r}")
        held, why = self.sessions.current(_session(ctx))
        if held is None:
            return json.dumps({"message": why})
        message = held.task.message
        if part == "context":
            return json.dumps(message.context)
        if part == "contract":
            return json.dumps(contract(message))
        read = self.machines.history if part == "history" else self.machines.definition
        return json.dumps(read(message))

    def _answer(self, ctx: Context, held: Held, kind: str, value: Any) -> dict[str, Any]:
        if not self.sessions.release(_session(ctx), held):
            return {"accepted": False, "message": NO_TASK}
        held.answer(kind, value)
        return {"accepted": True, "message": ANSWERED}


def agent_server(
    handoff: HandOff, agent_type: str, machines: MachineReads | None = None
) -> MCPServer:
    """The agent door's MCP server, serving the hand-off's tasks (and, when given a client
    on the database, the held task's machine's history and state's definition)."""
    server = MCPServer(
        "fsm-celery agent",
        instructions=f"You are an fsm-celery agent of type {agent_type!r}. Call next_task; do "
        "what its prompt asks with its context; heartbeat while you work; submit an output "
        "matching its output_contract (fix the problems a refused submit names), or fail, or "
        "hand_back. Then call next_task again (or give submit next_wait_seconds: its answer "
        "then holds the next task). The resources fsm-celery://task/context, /contract, "
        "/history and /definition show the held task's context, output contract, machine "
        "history and state definition.",
        log_level="WARNING",
    )
    tools = _Tools(Sessions(handoff), machines or MachineReads(None))
    for fn, hints in tools.all():
        server.add_tool(fn, name=fn.__name__, annotations=hints, structured_output=True)
    server.resource(TASK_URI, name="held_task", mime_type="application/json")(tools.held_task)
    return server


def password_of(redis_url: str) -> str | None:
    """The password of the Redis URL's credentials: the agent's, over HTTP its bearer token."""
    password = urlsplit(redis_url).password
    return unquote(password) if password else None


def serve(
    agent: Agent, *, http: tuple[str, int] | None = None, machines: MachineReads | None = None
) -> None:
    """Run the agent with the door's handler and serve its tools over stdio (or streamable
    HTTP at http://HOST:PORT/mcp) until the client closes them; then stop the agent, which
    hands back the tasks still parked (its shutdown grace is the door's to give: none)."""
    handoff = HandOff()
    agent.handler()(handoff.handle)
    server = agent_server(handoff, agent.agent_type, machines)
    running = threading.Thread(target=agent.run, kwargs={"install_signals": False}, daemon=True)
    running.start()
    try:
        if http is None:
            server.run("stdio")
        else:
            import uvicorn

            host, port = http
            # Each answer as one JSON body, not an SSE stream: the mcp client closes an SSE
            # response once it holds the answer, and with it the connection, so every call
            # paid a new TCP connection (bench.mcp: a state over HTTP twice as slow). The
            # door sends nothing in a call but its answer (no progress, no server requests).
            app = server.streamable_http_app(
                streamable_http_path=PATH, host=host, json_response=True
            )
            door = AgentBearer(app, password_of(agent.redis_url) or "")
            uvicorn.run(door, host=host, port=port, log_level="info")
    finally:
        agent.stop()
        running.join(10)


class AgentBearer:
    """The ASGI app in front of the door: every HTTP request carries the agent's Redis
    password as its bearer token, the door's one credential; anything else is a 401."""

    def __init__(self, app: ASGIApp, password: str) -> None:
        if not password:
            raise ValueError("the agent's Redis URL has no password: its credentials are needed")
        self.app = app
        self.password = password.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            header = Headers(scope=scope).get("authorization") or ""
            scheme, _, token = header.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                await unauthorized(send, "a token is needed: Authorization: Bearer <token>")
                return
            if not hmac.compare_digest(token.strip().encode(), self.password):
                await unauthorized(send, "invalid token")
                return
        await self.app(scope, receive, send)
