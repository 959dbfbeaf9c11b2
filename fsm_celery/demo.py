"""The embedded demo: SQLite, an in-process Celery worker and in-process mock agents."""

from __future__ import annotations

import json
import secrets
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from fsm_celery import wiring
from fsm_celery.agent.mock import MockScript
from fsm_celery.channel.memory import MemoryBus
from fsm_celery.client import Client
from fsm_celery.config import Settings
from fsm_celery.core.messages import task_channel
from fsm_celery.engine import Inbound, MachineEngine
from fsm_celery.store.db import upgrade

Out = Callable[[str], None]
TERMINAL = {"completed", "failed", "cancelled"}
THINK = (0.02, 0.15)  # seconds a mock agent works on a task


def run_demo(definitions: str | Path, out: Out = print, timeout: float = 60.0) -> bool:
    """Run four machines to their end with mock agents; True when all of them finished."""
    from celery.contrib.testing.worker import start_worker

    from fsm_celery.worker import tasks
    from fsm_celery.worker.app import app

    with tempfile.TemporaryDirectory(prefix="fsm-celery-demo-") as folder:
        settings = Settings(
            database_url=f"sqlite:///{Path(folder) / 'demo.sqlite3'}",
            broker_url="memory://localhost/",
            task_token_secret=secrets.token_hex(16),
            definitions_path=str(definitions),
        )
        app.conf.update(
            broker_url="memory://localhost/",
            broker_transport_options={"polling_interval": 0.01},
            task_default_queue=settings.queue,
        )
        bus = MemoryBus(settings.channel_prefix)
        engine = wiring.machine_engine(settings, dispatcher=bus)
        upgrade(engine.db)
        tasks.install_engine(engine)
        client = wiring.client(settings, engine)
        for machine_type, version, _ in client.load_definitions():
            out(f"loaded definition {machine_type} v{version}")
        # what the ack bridge does in production, in the inline mode
        apply = wiring.ack_handler(settings, inline=True, engine=engine)
        steady = _agent(bus, settings, MockScript(seed=7, think=THINK), apply)
        shaky = _agent(
            bus,
            settings,
            MockScript(
                seed=7,
                think=THINK,
                overrides={("ANALYZE_ISSUE", 1): {"needsSpec": False, "complexity": "low"}},
                failures={"RUN_TESTS": frozenset({1})},
            ),
            apply,
        )
        with start_worker(
            app, pool="threads", concurrency=2, perform_ping_check=False, loglevel="WARNING"
        ):
            ids = [
                client.start_machine(
                    "cto_build_project", {"projectName": "sla-api", "githubIssue": 726}, steady
                ),
                client.start_machine(
                    "cto_build_project", {"projectName": "status-page", "githubIssue": 731}, shaky
                ),
                client.start_machine(
                    "cto_fix_bug", {"projectName": "sla-api", "githubIssue": 740}, steady
                ),
                client.start_machine("cto_infrastructure_check", {}, steady),
            ]
            scanning = threading.Event()
            scanner = threading.Thread(target=_scan, args=(engine, scanning), daemon=True)
            scanner.start()  # timeouts and retry delays, as beat's scan does in production
            done = _follow(client, ids, out, timeout)
            scanning.set()
            scanner.join(5)
        bus.close()
        engine.db.dispose()
        return done


def _scan(engine: MachineEngine, stop: threading.Event) -> None:
    while not stop.wait(0.5):
        engine.scan.run()


def _agent(
    bus: MemoryBus, settings: Settings, mock: MockScript, send: Callable[[list[Inbound]], object]
) -> uuid.UUID:
    agent_id = uuid.uuid4()

    def handle(message: str) -> None:
        task = json.loads(message)
        time.sleep(mock.think_seconds(task["machineId"], task["attempt"]))
        send([Inbound(json.dumps(mock.answer(task)), agent_id)])

    bus.subscribe(task_channel(str(agent_id), settings.channel_prefix), handle)
    return agent_id


def _follow(client: Client, ids: list[uuid.UUID], out: Out, timeout: float) -> bool:
    names = {mid: f"{client.get_machine(mid).type}#{n}" for n, mid in enumerate(ids, 1)}
    shown = dict.fromkeys(ids, 0)
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        for mid in ids:
            rows = client.history(mid)
            for row in rows[shown[mid] :]:
                mark = "ok  " if row.success else "FAIL"
                note = f"  ({row.error_message})" if row.error_message else ""
                out(
                    f"{time.monotonic() - started:6.2f}s  {names[mid]:28} {mark} "
                    f"{row.from_state or '(start)':>15} -> {row.to_state}{note}"
                )
            shown[mid] = len(rows)
        machines = [client.get_machine(mid) for mid in ids]
        if all(m.status in TERMINAL for m in machines):
            out("")
            for m in machines:
                out(f"{names[m.id]:28} {m.status:10} after {shown[m.id] - 1} transitions")
            return True
        time.sleep(0.05)
    out(f"demo timed out after {timeout:.0f}s")
    return False
