"""What `fsm-celery` prints, through the real entry point against a real deployment: tables
with headers, statistics people can read, filters and ids as a user types them, a closed pipe,
a busy port, and an agent that tries to take over the operator's terminal."""

from __future__ import annotations

import importlib.metadata
import json
import re
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, select
from sqlalchemy.engine import Connection, Engine

from fsm_celery import wiring
from fsm_celery.exceptions import AmbiguousMachineId, MachineNotFound
from fsm_celery.store.tables import machines
from tests.support.agents import ScriptedAgent
from tests.support.databases import records_refused
from tests.support.messages import SILENT, Reply, ack_for, heartbeat_for
from tests.support.processes import FsmEnv

FSM_CELERY = str(Path(sys.executable).parent / "fsm-celery")
# an agent's text that retitles the window, clears the screen, colours it (C1 CSI) and reverses
# what follows (a bidi override)
ATTACK = "\x1b]0;pwned\x07\x1b[2J\x9b31m\u202egnp.exe\u2066x\u2069 done"
SHOWN = "\\x1b]0;pwned\\x07\\x1b[2J\\x9b31m\\u202egnp.exe\\u2066x\\u2069 done"
DURATION = re.compile(r"^(\d+ ms|\d+\.\d s|\d+ min( \d+ s)?|\d+ h( \d+ min)?|\d+ d( \d+ h)?)$")


@pytest.fixture(scope="module")
def deployment(env_factory: Callable[..., FsmEnv]) -> FsmEnv:
    env = env_factory("cli_output", transition_mode="inline")
    env.start_worker()
    env.start_bridge()
    return env


def cli(
    env: FsmEnv, *args: str, extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`fsm-celery ARGS` as an operator runs it, with the deployment's FSM_* settings."""
    return subprocess.run(
        [FSM_CELERY, *args],
        env={**env.env, **(extra or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def ok(env: FsmEnv, *args: str) -> str:
    done = cli(env, *args)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr == "", done.stderr
    return done.stdout


def refused(env: FsmEnv, *args: str, status: int) -> str:
    done = cli(env, *args)
    assert done.returncode == status, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    return done.stderr


def _header(output: str) -> list[str]:
    return output.splitlines()[0].split()


def test_version_is_the_package_version(deployment: FsmEnv) -> None:
    version = importlib.metadata.version("fsm-celery")
    assert ok(deployment, "--version").strip() == f"fsm-celery, version {version}"


def test_stats_is_a_table_and_json_on_request(deployment: FsmEnv) -> None:
    with ScriptedAgent(deployment) as agent:
        mid = deployment.client.start_machine("test_pair", {}, agent_id=agent.id)
        deployment.wait_until_done(mid)
    shown = ok(deployment, "stats").splitlines()
    assert shown[0] == "Machines" and shown[1].split()[:3] == ["TYPE", "RUNNING", "PAUSED"]
    assert "Attempts per state" in shown and "Rejected messages" in shown
    [first] = [line.split() for line in shown if line.startswith("test_pair ") and "FIRST" in line]
    assert first[:4] == ["test_pair", "FIRST", "1", "100.0"]
    assert len(shown) < 80 and not any(line.lstrip().startswith(("{", '"')) for line in shown)
    data = json.loads(ok(deployment, "stats", "--json"))
    assert data["machines"]["test_pair"]["completed"] >= 1


def test_every_list_has_a_header_row(deployment: FsmEnv) -> None:
    mid = deployment.client.start_machine("test_pair", {})
    assert _header(ok(deployment, "list"))[:4] == ["ID", "TYPE", "STATUS", "STATE"]
    assert _header(ok(deployment, "history", str(mid)))[:5] == [
        "ATTEMPT",
        "RESULT",
        "EVENT",
        "TRANSITION",
        "TOOK",
    ]
    assert _header(ok(deployment, "agents"))[:3] == ["ID", "TYPE", "STATUS"]
    assert _header(ok(deployment, "rejected"))[:3] == ["RECEIVED", "REASON", "MACHINE"]
    assert _header(ok(deployment, "rejected", "--parked"))[:3] == ["PARKED", "SOURCE", "REASON"]
    assert _header(ok(deployment, "schedules"))[:3] == ["SCHEDULE", "CRON", "TIMEZONE"]
    listed = json.loads(ok(deployment, "list", "--json", "--type", "test_pair"))
    assert str(mid) in {m["id"] for m in listed}
    deployment.client.cancel(mid, "test")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--status", "runing"), ("'runing' is not one of", "'running'", "'cancelled'")),
        (("--type", "cto_fix_bugs"), ("unknown machine type 'cto_fix_bugs'", "cto_fix_bug,")),
        (("--agent-type", "ctoo"), ("unknown agent type 'ctoo'", "cto,", "tester")),
    ],
)
def test_list_refuses_a_filter_value_nothing_has(
    deployment: FsmEnv, args: tuple[str, ...], says: tuple[str, ...]
) -> None:
    error = refused(deployment, "list", *args, status=2)
    [line] = [line for line in error.splitlines() if line.startswith("Error: ")]
    for words in says:
        assert words in line, line


def test_list_filters_by_known_values(deployment: FsmEnv) -> None:
    mid = deployment.client.start_machine("test_pair", {})
    deployment.client.cancel(mid, "test")
    filters = ("--type", "test_pair", "--agent-type", "tester", "--status", "cancelled")
    listed = ok(deployment, "list", *filters).splitlines()
    assert listed[0].startswith("ID ") and any(line.startswith(str(mid)) for line in listed)
    assert all(" cancelled " in line for line in listed[1:])


def test_start_with_an_unknown_type_names_the_known_ones(deployment: FsmEnv) -> None:
    error = refused(deployment, "start", "cto_fix_bugs", status=1).strip()
    assert "\n" not in error
    assert error.startswith("error: unknown machine type 'cto_fix_bugs' (known types: ")
    for known in ("cto_build_project", "cto_fix_bug", "research_pipeline", "test_pair"):
        assert known in error


def test_a_closed_pipe_ends_the_output_quietly(deployment: FsmEnv) -> None:
    """`fsm-celery list | head -1`: the reader goes away before the list is written."""
    for _ in range(3):
        deployment.client.start_machine("test_pair", {})
    reader = subprocess.Popen(
        [FSM_CELERY, "list", "--limit", "1000"],
        env=deployment.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert reader.stdout is not None and reader.stderr is not None
    reader.stdout.close()  # as head does once it has its line
    _, stderr = reader.communicate(timeout=60)
    assert reader.returncode == 1  # click's status for a closed pipe, as for git's SIGPIPE: not 0
    assert stderr == b""
    piped = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {FSM_CELERY} list --limit 1000 | head -1"],
        env=deployment.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert piped.stdout.startswith("ID ") and "Error" not in piped.stderr + piped.stdout
    assert "BrokenPipe" not in piped.stderr


def test_history_shows_who_acted_why_and_durations_people_read(deployment: FsmEnv) -> None:
    with ScriptedAgent(deployment, {"FIRST": [SILENT]}) as agent:
        mid = deployment.client.start_machine("test_pair", {}, agent_id=agent.id)
        agent.wait_for_tasks(1)
        time.sleep(0.3)  # the state ran a while before it was paused
        ok(deployment, "pause", str(mid), "--reason", "deploy freeze", "--actor", "alice")
        ok(deployment, "force", str(mid), "DONE", "--actor", "bob", "--reason", "shipped by hand")
        time.sleep(1.2)  # completed a while: none of it is DONE's duration
        ok(deployment, "force", str(mid), "SECOND", "--actor", "carol", "--reason", "redo it")
        deployment.wait_until_done(mid)
    rows = [line.split("  ") for line in ok(deployment, "history", str(mid)).splitlines()]
    cells = [[c.strip() for c in row if c.strip()] for row in rows]
    assert cells[0] == [
        "ATTEMPT",
        "RESULT",
        "EVENT",
        "TRANSITION",
        "TOOK",
        "ACTOR",
        "REASON",
        "ERROR",
    ]
    by_event = {row[2]: row for row in cells[1:] if row[2] in ("pause", "force")}
    pause = by_event["pause"]
    assert pause[3:] == ["FIRST -> FIRST", pause[4], "alice", "deploy freeze", "-"]
    assert DURATION.match(pause[4]), pause
    forced = [row for row in cells[1:] if row[2] == "force"]
    assert forced[0][3:] == ["FIRST -> DONE", "-", "bob", "shipped by hand", "-"]  # paused
    assert forced[1][3:] == ["DONE -> SECOND", "-", "carol", "redo it", "-"]  # completed
    timed = json.loads(ok(deployment, "history", str(mid), "--json"))
    assert [r["duration_ms"] for r in timed if r["event"] == "force"] == [None, None]


def test_history_months_lists_the_partitions_and_archive_says_what_would_go(
    deployment: FsmEnv,
) -> None:
    mid = deployment.client.start_machine("test_pair", {})
    lines = ok(deployment, "history", "months").splitlines()
    assert lines[0].split() == ["TABLE", "MONTH", "ROWS", "SIZE", "PARTITION"]
    now = datetime.now(UTC)
    this_month = f"state_transitions_p{now:%Y_%m}"
    assert any(line.split()[-1] == this_month for line in lines[1:]), lines
    assert sum(line.startswith("rejected_messages") for line in lines) >= 4  # this month, 3 ahead
    listed = json.loads(ok(deployment, "history", "months", "--json"))
    assert this_month in [p["name"] for p in listed["state_transitions"]]
    # nothing is old enough here: a dry run says so, and changes nothing
    assert ok(deployment, "history", "archive", "--older-than", "30", "--dry-run").strip() == (
        "nothing to archive"
    )
    assert "FSM_HISTORY_RETENTION_DAYS is 0" in refused(deployment, "history", "archive", status=2)
    both = refused(
        deployment, "history", "archive", "--older-than", "9", "--table", "--drop", status=2
    )
    assert "give one of --to, --table and --drop" in both
    # a machine's history, its options before or after its id
    assert json.loads(ok(deployment, "history", "--json", str(mid)))[0]["to_state"] == "FIRST"
    assert "(start) -> FIRST" in ok(deployment, "history", str(mid)[:8])
    # a machine whose month the retention removed (its row kept, its history rows gone)
    archived = "5ea13333-0000-4000-8000-000000000003"
    _copy_machine(deployment.client.engine.db, mid, archived)
    done = cli(deployment, "history", archived)
    assert done.returncode == 0 and done.stderr == (
        f"machine {archived} has no history: its month was archived and removed by the "
        "retention (FSM_HISTORY_RETENTION_DAYS)\n"
    ), done.stderr


def _copy_machine(db: Engine, of: uuid.UUID, new_id: str) -> None:
    with db.begin() as conn:
        row = conn.execute(select(machines).where(machines.c.id == of)).one()
        conn.execute(machines.insert().values({**row._asdict(), "id": uuid.UUID(new_id)}))


def test_an_id_prefix_names_a_machine_everywhere(deployment: FsmEnv) -> None:
    with ScriptedAgent(deployment, {"FIRST": [SILENT, SILENT]}) as agent:
        mid = deployment.client.start_machine("test_pair", {}, agent_id=agent.id)
        agent.wait_for_tasks(1)
        short = str(mid)[:8]  # as the dashboard shows it
        assert ok(deployment, "status", short).splitlines()[0].split() == ["id", str(mid)]
        assert f"{mid}  paused" in ok(deployment, "pause", short, "--reason", "by prefix")
        assert "(start) -> FIRST" in ok(deployment, "history", short[:5])
        assert ok(deployment, "budget", str(mid)[:13], "--tokens", "5").startswith(str(mid))
        ok(deployment, "rejected", "--machine-id", short)
        assert f"{mid}  running" in ok(deployment, "resume", short.upper())
        assert deployment.client.get_machine(short).id == mid
        assert "resume" in [h.event for h in deployment.client.history(short)]
        ok(deployment, "cancel", short)


def test_an_ambiguous_or_short_prefix_is_refused_naming_the_candidates(deployment: FsmEnv) -> None:
    mid = deployment.client.start_machine("test_pair", {})
    deployment.client.cancel(mid, "test")
    first, second = "abcd1111-0000-4000-8000-000000000001", "abcd2222-0000-4000-8000-000000000002"
    _copy_machine(deployment.client.engine.db, mid, first)
    _copy_machine(deployment.client.engine.db, mid, second)
    error = refused(deployment, "status", "abcd", status=1).strip()
    assert error == f"error: machine id 'abcd' is ambiguous: give more of it ({first}, {second})"
    assert ok(deployment, "status", "abcd2").splitlines()[0].split() == ["id", second]
    too_short = refused(deployment, "history", "abc", status=1).strip()
    assert too_short == (
        "error: no machine with id 'abc': give its full id or at least 4 hex digits"
    )
    assert "no machine with id 'abcd3'" in refused(deployment, "status", "abcd3", status=1)
    with pytest.raises(AmbiguousMachineId) as raised:
        deployment.client.get_machine("ABCD")
    assert raised.value.candidates == [first, second]
    with pytest.raises(MachineNotFound):
        deployment.client.pause("abcd%", "test")


@pytest.fixture
def statements(deployment: FsmEnv) -> Iterator[list[tuple[str, Any]]]:
    """The statements the client's engine sends, as sent."""
    seen: list[tuple[str, Any]] = []

    def note(_conn: Connection, _cursor: object, sql: str, params: Any, *_: object) -> None:
        seen.append((sql, params))

    db = deployment.client.engine.db
    event.listen(db, "before_cursor_execute", note)
    yield seen
    event.remove(db, "before_cursor_execute", note)


def test_a_prefix_is_found_through_the_primary_key_index(
    deployment: FsmEnv, statements: list[tuple[str, Any]]
) -> None:
    mid = deployment.client.start_machine("test_pair", {})
    assert deployment.client.full_id(str(mid)[:6]) == mid
    [(sql, params)] = [(s, p) for s, p in statements if "BETWEEN" in s]
    with deployment.client.engine.db.connect() as conn:
        conn.exec_driver_sql("SET enable_seqscan = off")  # a small table: make a scan costly
        plan = "\n".join(r[0] for r in conn.exec_driver_sql(f"EXPLAIN {sql}", params))
    assert "state_machines_pkey" in plan and "Index" in plan, plan
    deployment.client.cancel(mid, "test")


def test_an_id_prefix_names_a_machine_in_the_embedded_mode(
    deployment: FsmEnv, tmp_path: Path
) -> None:
    """SQLite stores ids as 32 hex digits: the same range finds them, through its index."""
    url = f"sqlite:///{tmp_path / 'fsm.sqlite3'}"
    embedded = {"FSM_DATABASE_URL": url, "FSM_QUEUE": f"fsm-embedded-{uuid.uuid4().hex}"}
    for args in (("db", "upgrade"), ("definitions", "load")):
        assert cli(deployment, *args, extra=embedded).returncode == 0
    context = '{"projectName": "sla-api", "githubIssue": 740}'
    started = cli(deployment, "start", "cto_fix_bug", "--context", context, extra=embedded)
    assert started.returncode == 0, started.stderr
    mid = uuid.UUID(started.stdout.strip())
    shown = cli(deployment, "status", str(mid)[:8], extra=embedded)
    assert shown.returncode == 0 and shown.stdout.splitlines()[0].split() == ["id", str(mid)]
    client = wiring.client(deployment.settings.model_copy(update={"database_url": url}))
    db = client.engine.db
    _copy_machine(db, mid, "abcd1111-0000-4000-8000-000000000001")
    _copy_machine(db, mid, "abcd2222-0000-4000-8000-000000000002")
    ambiguous = cli(deployment, "history", "abcd", extra=embedded)
    assert ambiguous.returncode == 1 and "'abcd' is ambiguous" in ambiguous.stderr
    sent: list[tuple[str, Any]] = []
    event.listen(db, "before_cursor_execute", lambda *a: sent.append((a[2], a[3])))
    assert str(client.full_id("abcd2")) == "abcd2222-0000-4000-8000-000000000002"
    [(sql, params)] = [(s, p) for s, p in sent if "BETWEEN" in s]
    with db.connect() as conn:
        plan = str(conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}", params).all())
    assert "SEARCH state_machines USING" in plan and "INDEX" in plan, plan
    db.dispose()


def test_a_busy_dashboard_port_is_one_line(deployment: FsmEnv) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = cli(deployment, "dashboard", "--port", str(port))
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout == ""
    assert done.stderr == (
        f"error: port {port} on 127.0.0.1 is in use — pick another with --port\n"
    )


def _wait(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _assert_escaped(output: str) -> None:
    assert "\x1b" not in output and "\x9b" not in output and "\u202e" not in output
    assert SHOWN in output, output


def test_an_agents_escape_sequences_never_reach_the_terminal(deployment: FsmEnv) -> None:
    client = deployment.client
    with ScriptedAgent(deployment, {"FIRST": [SILENT, SILENT]}) as agent:
        mid = client.start_machine("test_pair", {}, agent_id=agent.id)
        task = agent.wait_for_tasks(1)
        agent.send(heartbeat_for(task, ATTACK))
        _wait(lambda: client.get_machine(mid).progress == ATTACK, "the progress was not kept")
        status = cli(deployment, "status", str(mid))
        _assert_escaped(status.stdout)
        assert f"progress       {SHOWN}" in status.stdout
        agent.send(ack_for(task, Reply(success=False, output={}, error=ATTACK)))
        _wait(lambda: len(client.history(mid)) > 1, "the failure was not applied")
        client.cancel(mid, "test")
    history = cli(deployment, "history", str(mid))
    _assert_escaped(history.stdout)
    as_json = cli(deployment, "history", str(mid), "--json").stdout
    assert "\x1b" not in as_json and "\\u001b]0;pwned" in as_json
    assert json.loads(as_json)[1]["error_message"].startswith(ATTACK)


def test_a_parked_message_is_shown_escaped(deployment: FsmEnv) -> None:
    marker = f"unrecordable-{uuid.uuid4().hex}"
    with (
        records_refused(deployment.client.engine.db, marker),  # it cannot even be recorded
        ScriptedAgent(deployment, own_stream=True) as agent,
    ):
        agent.send('{"broken": "' + marker + ATTACK)
        _wait(
            lambda: any(marker in p["message"] for p in deployment.client.parked(100)),
            "the message was not parked",
            timeout=30,
        )
    parked = cli(deployment, "rejected", "--parked")
    assert parked.returncode == 0 and marker in parked.stdout
    _assert_escaped(parked.stdout)
