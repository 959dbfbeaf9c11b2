"""A bridge stops with all its consumer processes when only its main process is signalled, as
pkill, `docker stop` or a supervisor does (a terminal's Ctrl-C reaches the whole group)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import psutil

from tests.support.processes import FsmEnv


def test_a_term_to_the_main_process_stops_every_consumer_at_once(
    env_factory: Callable[..., FsmEnv],
) -> None:
    env = env_factory("bridge_stop")
    bridge = env.start_bridge(processes=3)
    bridge.wait_for_log("bridge-2 INFO ack bridge reading")
    main = psutil.Process(bridge.popen.pid)
    consumers = main.children(recursive=True)
    assert len([c for c in consumers if "spawn_main" in " ".join(c.cmdline())]) == 2

    os.kill(main.pid, signal.SIGTERM)  # the main process alone, not its group
    bridge.popen.wait(timeout=60)
    _, alive = psutil.wait_procs(consumers, timeout=5)
    assert not alive, f"consumers left running: {[p.pid for p in alive]}"
    # It used to wait 15 s for consumers nobody had told to stop, then kill them: now each stops
    # because it was told (and says so), not because a timer ran out.
    log = bridge.log.read_text()
    for name in ("bridge-1", "bridge-2"):
        assert f"{name} INFO ack bridge stopped reading: told to stop" in log, log
    assert "ack bridge stopped" in log
