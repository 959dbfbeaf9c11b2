"""The MCP agent door's cost per state against the SDK agent's, in both transition modes.

    .venv/bin/python -m bench.mcp [--machines 1] [--seconds 10] [--warm 2]
        [--modes celery inline] [--doors sdk http stdio http1 stdio1]

In each mode, one deployment (two workers with beat, the ack bridge) and, one after the other,
agents of the same agent type, each with its own Redis credentials (as
`fsm-celery agents credentials --apply` issues them) and its own --machines bench_loop machines
(two states in a loop), stored due for dispatch and entered before the agent starts:

- sdk: bench/sdk_agent.py, an SDK Agent of concurrency 1 answering every task at once;
- http: a real `fsm-celery mcp agent --http` process (an SDK Agent of concurrency 1 whose
  handler parks the task for an MCP session), driven by the `mcp` package's ClientSession over
  streamable HTTP, with the agent's password as its bearer token;
- stdio: the same door over stdio, the client starting it as a coding agent does;
- http1, stdio1: the same, the client asking for the next task in submit's own answer
  (`submit(output, next_wait_seconds)`): one call a state instead of two.

The MCP client is a coding agent that thinks for no time: next_task, submit {}, next_task …
as fast as the door answers. The cost of a state is the time from an answer given (the SDK's
handler returning; the client sending submit) to the next task in hand (the SDK's handler
called; next_task's result received), on CLOCK_MONOTONIC, which every process of the machine
shares. Measured over --seconds after --warm seconds of the agent's first task: the
percentiles (p50, p90, p99), states per second, the agent's CPU per state (the SDK agent's
process, the door's process; and the client's, the benchmark's own process), and, for the
two-call doors, submit's round trip (p50). The ratio door ÷ sdk is taken within a mode; the
issue's bound (twice the SDK's) is judged on the p50 and the mean. With more --machines than
the agents' one slot, a state's next task may be another machine's, and each agent's row says
how many machines it served in the window.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import socket
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
import psutil
from mcp.client import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from sqlalchemy import text

from bench.common import (
    ROOT,
    FsmEnv,
    commit,
    deployment,
    dispatched,
    last_history_id,
    machine_info,
    store_machines,
    tear_down,
    transitions,
    wait,
    write_result,
)
from bench.throughput import start_workers
from fsm_celery.channel import acl
from fsm_celery.exceptions import CommandRefused
from fsm_celery.mcp.agent import password_of

AGENT_TYPE = "bench"  # bench/definitions' machines'
DOORS = ("sdk", "http", "stdio", "http1", "stdio1")
NEXT_WAIT = 10  # seconds a next_task waits for a task (called again while none comes)
LIMIT = 2.0  # the issue's bound: a state through the door at most this many times the SDK's


@dataclass
class Run:
    """One agent's states: (answer given, next task in hand) on CLOCK_MONOTONIC, and, for a
    door, each state's submit round trip; the CPU seconds of the window by process."""

    states: list[tuple[float, float]] = field(default_factory=list)
    machines: list[str] = field(default_factory=list)  # each state's next task's machine
    submits: list[float] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)
    window: tuple[float, float] = (0.0, 0.0)

    def figures(self) -> dict[str, Any]:
        start, end = self.window
        inside = [i for i, (given, _) in enumerate(self.states) if start <= given < end]
        costs = sorted((self.states[i][1] - self.states[i][0]) * 1000 for i in inside)
        count = len(costs)
        figures: dict[str, Any] = {
            "states": count,
            "machines_served": len({self.machines[i] for i in inside}),
            "states_per_s": round(count / (end - start), 1) if end > start else None,
            **percentiles(costs),
            "cpu_ms_per_state": {
                k: round(v * 1000 / max(count, 1), 3) for k, v in self.cpu.items()
            },
        }
        if self.submits:
            submits = sorted(self.submits[i] * 1000 for i in inside)
            figures["submit_p50_ms"] = percentiles(submits)["p50_ms"]
        return figures


def percentiles(samples: list[float]) -> dict[str, float | None]:
    if len(samples) < 2:
        return {"p50_ms": None, "p90_ms": None, "p99_ms": None, "max_ms": None}
    q = statistics.quantiles(samples, n=100, method="inclusive")  # within the samples' range
    return {
        "p50_ms": round(q[49], 2),
        "p90_ms": round(q[89], 2),
        "p99_ms": round(q[98], 2),
        "max_ms": round(samples[-1], 2),
    }


def cpu_seconds(pids: list[int], children: bool = True) -> float:
    """CPU seconds of the processes (and their children) so far."""
    total = 0.0
    for pid in pids:
        try:
            parent = psutil.Process(pid)
            for proc in [parent, *(parent.children(recursive=True) if children else [])]:
                times = proc.cpu_times()
                total += times.user + times.system
        except psutil.Error:
            pass
    return total


# -- the SDK agent ------------------------------------------------------------------------------


def run_sdk(env: FsmEnv, url: str, warm: float, seconds: float) -> Run:
    after = last_history_id(env)
    log = Path(tempfile.mkstemp(prefix="bench-sdk-", suffix=".log")[1])
    argv = [sys.executable, str(ROOT / "bench" / "sdk_agent.py"), AGENT_TYPE, str(log)]
    proc = env._spawn("sdk-agent", argv, {**env.env, "FSM_REDIS_URL": url})
    wait(lambda: transitions(env, after) >= 1, 60, "the SDK agent's first answer")
    run = Run()
    time.sleep(warm)
    before = cpu_seconds([proc.popen.pid])
    start = time.monotonic()
    time.sleep(seconds)
    run.window = (start, time.monotonic())
    run.cpu = {"agent": cpu_seconds([proc.popen.pid]) - before}
    proc.stop()
    events = [line.split() for line in log.read_text().splitlines() if line]
    log.unlink()
    times = sorted((float(at), kind, machine) for kind, machine, _, at in events)
    given: float | None = None
    for at, kind, machine in times:
        if kind == "A":
            given = at
        elif given is not None:
            run.states.append((given, at))
            run.machines.append(machine)
            given = None
    return run


# -- the MCP door -------------------------------------------------------------------------------


async def call(session: ClientSession, tool: str, /, **arguments: Any) -> dict[str, Any]:
    """A tool's structured answer (an error raises)."""
    result = await session.call_tool(tool, arguments)
    if result.is_error:
        text_ = " ".join(getattr(block, "text", "") for block in result.content)
        raise RuntimeError(f"{tool}: {text_}")
    return dict(result.structured_content or {})


async def take(session: ClientSession) -> dict[str, Any]:
    """The next task, however many next_task calls it takes."""
    while True:
        found = await call(session, "next_task", wait_seconds=NEXT_WAIT)
        if found.get("task") is not None:
            return dict(found["task"])


async def drive(
    session: ClientSession,
    pids: Callable[[], list[int]],
    warm: float,
    seconds: float,
    one_call: bool = False,
) -> Run:
    """Work the door's tasks as fast as it gives them, for warm + seconds: submit, then
    next_task; or (one_call) submit taking the next task in its answer."""
    run = Run()
    await take(session)
    # as the SDK agent's run, the warm-up counts from the first state answered and moved on:
    # the bridge finds a new agent's ack stream within 2 s (acks/streams.py, MAINTAIN_SECONDS)
    await call(session, "submit", output={})
    await take(session)
    start = time.monotonic() + warm
    end = start + seconds
    before: dict[str, float] = {}
    while True:
        given = time.monotonic()
        if given >= end:
            break
        if not before and given >= start:
            before = {
                "door": cpu_seconds(pids()),
                "client": cpu_seconds([os.getpid()], children=False),
            }
            start = given
        wanted = {"next_wait_seconds": NEXT_WAIT} if one_call else {}
        answered = await call(session, "submit", output={}, **wanted)
        if not answered.get("accepted"):
            raise RuntimeError(f"submit refused: {answered}")
        submitted = time.monotonic()
        task = (answered.get("next") or {}).get("task") or await take(session)
        run.states.append((given, time.monotonic()))
        run.machines.append(task["machine_id"])
        if not one_call:
            run.submits.append(submitted - given)
    run.cpu = {
        "door": cpu_seconds(pids()) - before.get("door", 0.0),
        "client": cpu_seconds([os.getpid()], children=False) - before.get("client", 0.0),
    }
    run.window = (start, end)
    return run


def run_http(env: FsmEnv, url: str, warm: float, seconds: float, one_call: bool = False) -> Run:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = [sys.executable, "-m", "fsm_celery", "mcp", "agent", "--agent-type", AGENT_TYPE]
    proc = env._spawn(
        "mcp-http", [*argv, "--http", "--port", str(port)], {**env.env, "FSM_REDIS_URL": url}
    )
    proc.wait_for_log("Application startup complete")
    headers = {"Authorization": f"Bearer {password_of(url)}"}

    async def main() -> Run:
        async with (
            httpx2.AsyncClient(headers=headers, timeout=NEXT_WAIT + 30) as http,
            streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http) as (r, w),
            ClientSession(r, w) as session,
        ):
            await session.initialize()
            return await drive(session, lambda: [proc.popen.pid], warm, seconds, one_call)

    try:
        return anyio.run(main)
    finally:
        proc.stop()


def run_stdio(env: FsmEnv, url: str, warm: float, seconds: float, one_call: bool = False) -> Run:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "fsm_celery", "mcp", "agent", "--agent-type", AGENT_TYPE],
        env={**env.env, "FSM_REDIS_URL": url},
        cwd=str(ROOT),
    )

    def door() -> list[int]:
        """The door's process: the child of this one the client started."""
        return [
            p.pid
            for p in psutil.Process().children()
            if "mcp" in p.cmdline() and "agent" in p.cmdline()
        ]

    async def main() -> Run:
        with tempfile.TemporaryFile() as errors:
            async with (
                stdio_client(params, errlog=errors) as (r, w),
                ClientSession(r, w) as session,
            ):
                await session.initialize()
                return await drive(session, door, warm, seconds, one_call)

    return anyio.run(main)


RUNNERS: dict[str, Callable[[FsmEnv, str, float, float], Run]] = {
    "sdk": run_sdk,
    "http": run_http,
    "stdio": run_stdio,
    "http1": functools.partial(run_http, one_call=True),
    "stdio1": functools.partial(run_stdio, one_call=True),
}


# -- a mode -------------------------------------------------------------------------------------


def measure(
    mode: str, doors: list[str], machines: int, warm: float, seconds: float
) -> dict[str, Any]:
    """Each door's figures in one deployment of the mode."""
    env = deployment(f"mcp_{mode}", transition_mode=mode)
    agents: list[str] = []
    try:
        start_workers(env)
        env.start_bridge()
        results: dict[str, Any] = {}
        for door in doors:
            agent_id = str(uuid.uuid4())
            agents.append(agent_id)
            url = env.issue_credentials(agent_id, AGENT_TYPE)
            store_machines(env, "bench_loop", "S0", machines, agent_id)
            dispatched(env, agent_id, machines)
            results[door] = RUNNERS[door](env, url, warm, seconds).figures()
            cancel_machines(env, agent_id)
        return results
    finally:
        tear_down(env)
        for agent_id in agents:  # after the bridge, which would create them again
            acl.delete_agent_user(env.redis, agent_id)


def cancel_machines(env: FsmEnv, agent_id: str) -> None:
    """End the door's machines: the next door's agent is alone in the deployment."""
    with env.client.engine.db.connect() as conn:
        found = conn.execute(
            text(
                "SELECT id FROM state_machines"
                " WHERE agent_id = CAST(:a AS uuid) AND status = 'running'"
            ),
            {"a": agent_id},
        )
        ids = [row[0] for row in found]
    for machine_id in ids:
        # one never served has no history (stored in bulk): its task dies with the agent
        with contextlib.suppress(CommandRefused):
            env.client.cancel(machine_id, "bench", "the door's run is over")


def ratios(results: dict[str, Any]) -> dict[str, Any]:
    """Each door's p50, p90, p99 ÷ the SDK's, and the SDK's states/s ÷ the door's."""
    sdk = results.get("sdk")
    if sdk is None:
        return {}
    found: dict[str, Any] = {}
    for door, figures in results.items():
        if door == "sdk":
            continue
        found[door] = {
            key: round(figures[key] / sdk[key], 2) if figures[key] and sdk[key] else None
            for key in ("p50_ms", "p90_ms", "p99_ms")
        }
        rates = figures["states_per_s"], sdk["states_per_s"]
        found[door]["per_state"] = round(rates[1] / rates[0], 2) if all(rates) else None
    return found


def show(mode: str, machines: int, results: dict[str, Any]) -> None:
    print(f"\n{mode} mode, {machines} machine(s): answer given → next task in hand")
    print(
        f"{'agent':>6} {'states':>7} {'states/s':>9} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} "
        f"{'max ms':>8} {'machines':>8} {'submit p50':>11}  CPU ms/state"
    )
    for door, r in results.items():
        cpu = ", ".join(f"{k} {v}" for k, v in r["cpu_ms_per_state"].items())
        print(
            f"{door:>6} {r['states']:>7} {r['states_per_s']:>9} {r['p50_ms']:>8} {r['p90_ms']:>8} "
            f"{r['p99_ms']:>8} {r['max_ms']:>8} {r['machines_served']:>8} "
            f"{r.get('submit_p50_ms', ''):>11}  {cpu}"
        )
    for door, ratio in ratios(results).items():
        # the bound is on a state's typical and mean cost; the tail is shown, too noisy on a
        # shared machine to judge by
        judged = [ratio["p50_ms"], ratio["per_state"]]
        verdict = "within" if None not in judged and max(judged) <= LIMIT else "OVER"
        print(
            f"{door} / sdk: p50 {ratio['p50_ms']}x, p90 {ratio['p90_ms']}x, "
            f"p99 {ratio['p99_ms']}x, time per state {ratio['per_state']}x "
            f"({verdict} the {LIMIT:g}x bound)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--machines", type=int, default=1, help="machines per agent")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured, per agent")
    parser.add_argument("--warm", type=float, default=2.0, help="seconds before measuring")
    parser.add_argument(
        "--modes", nargs="+", choices=["celery", "inline"], default=["celery", "inline"]
    )
    parser.add_argument("--doors", nargs="+", choices=DOORS, default=list(DOORS))
    args = parser.parse_args()
    if args.machines < 1 or args.seconds <= 0 or args.warm < 0:
        parser.error("--machines ≥ 1, --seconds > 0 and --warm ≥ 0")
    print(f"commit {commit()}, {machine_info()}")
    results = {}
    for mode in args.modes:
        results[mode] = measure(mode, args.doors, args.machines, args.warm, args.seconds)
        show(mode, args.machines, results[mode])
    path = write_result(
        "mcp",
        {
            "commit": commit(),
            "machines": args.machines,
            "seconds": args.seconds,
            "warm": args.warm,
            "modes": {m: {"agents": r, "ratios": ratios(r)} for m, r in results.items()},
        },
    )
    print(f"written {path}")


if __name__ == "__main__":
    main()
