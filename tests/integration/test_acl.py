"""Per-agent Redis users: an agent reads only its own and its type's tasks, writes acks only to
its own ack stream, and nothing else.

Every test runs against a throwaway redis-server of its own (never the shared one): ACL users
are server-wide, and these tests create and replace them.
"""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from fsm_celery.agent.sdk import GROUP, Agent
from fsm_celery.channel.acl import (
    acl_file_line,
    acl_setuser_command,
    agent_acl_rules,
    agent_username,
    create_agent_user,
    known_optional_commands,
    new_password,
)
from fsm_celery.core.messages import (
    StateCancel,
    ack_channel,
    ack_stream,
    agent_ack_stream,
    task_channel,
    task_stream,
)
from tests.support.messages import state_task_wire
from tests.support.services import start_redis, stop_redis

HOST = "127.0.0.1"
AGENT_TYPE = "cto"
ACK_MAXLEN = 10_000
AN_AGENT = "6f0c2a4e-8d1b-4c3a-9e5f-7a6b5c4d3e2f"  # fixed: it names cases, alike in every process


@dataclass(frozen=True)
class Server:
    """A redis-server this module started, and its default (all-powerful) user."""

    port: int
    admin: redis.Redis


@dataclass(frozen=True)
class AgentUser:
    """An agent with its own Redis user."""

    id: str
    prefix: str
    password: str

    @property
    def username(self) -> str:
        return agent_username(self.id)

    def task_stream(self) -> str:
        return task_stream(self.id, self.prefix)

    def type_stream(self) -> str:
        return task_stream(AGENT_TYPE, self.prefix)

    def ack_stream(self) -> str:
        return agent_ack_stream(self.id, self.prefix)


@dataclass(frozen=True)
class Pair:
    """Two agents of the same type on one deployment (one channel prefix)."""

    prefix: str
    a: AgentUser
    b: AgentUser


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    process, port = start_redis(tmp_path_factory.mktemp("redis-acl"))
    admin = redis.Redis(host=HOST, port=port)
    try:
        yield Server(port, admin)
    finally:
        admin.close()
        stop_redis(process)


@pytest.fixture(scope="module", params=["", "t1:"], ids=["no-prefix", "prefix-t1"])
def pair(request: pytest.FixtureRequest, server: Server) -> Pair:
    prefix: str = request.param
    return Pair(prefix, new_agent(server, prefix), new_agent(server, prefix))


def new_agent(server: Server, prefix: str) -> AgentUser:
    """A new agent of type AGENT_TYPE with a Redis user of its own."""
    agent = AgentUser(str(uuid.uuid4()), prefix, new_password())
    create_agent_user(server.admin, agent.id, AGENT_TYPE, prefix, agent.password)
    return agent


@pytest.fixture
def connect(server: Server) -> Iterator[Callable[[AgentUser], redis.Redis]]:
    """Open connections as agents; all are closed after the test."""
    opened: list[redis.Redis] = []

    def as_agent(agent: AgentUser) -> redis.Redis:
        client = redis.Redis(
            host=HOST, port=server.port, username=agent.username, password=agent.password
        )
        opened.append(client)
        return client

    yield as_agent
    for client in opened:
        client.close()


@pytest.fixture
def as_a(pair: Pair, connect: Callable[[AgentUser], redis.Redis]) -> redis.Redis:
    return connect(pair.a)


def ensure_group(client: redis.Redis, stream: str) -> None:
    try:
        client.xgroup_create(stream, GROUP, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def subscriber(client: redis.Redis) -> redis.client.PubSub:
    pubsub: redis.client.PubSub = client.pubsub()  # type: ignore[no-untyped-call]
    return pubsub


def next_message(pubsub: redis.client.PubSub) -> dict[str, Any]:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        message: dict[str, Any] | None = pubsub.get_message(timeout=0.5)
        if message is not None:
            return message
    raise AssertionError("no pub/sub message within 5 s")


def state_task(deadline: datetime) -> str:
    return state_task_wire(deadline)


# What an agent may do -----------------------------------------------------------------------


def test_agent_creates_the_groups_of_its_own_and_its_type_stream(
    server: Server, pair: Pair, as_a: redis.Redis
) -> None:
    streams = (pair.a.task_stream(), pair.a.type_stream())
    server.admin.delete(*streams)  # other tests of the module made the type stream's group

    created = [as_a.xgroup_create(stream, GROUP, id="0", mkstream=True) for stream in streams]

    assert created == [True, True]
    for stream in streams:
        [group] = server.admin.xinfo_groups(stream)
        assert (group["name"], group["consumers"], group["pending"]) == (GROUP.encode(), 0, 0)


@pytest.mark.parametrize("which", ["own", "type"])
def test_agent_reads_acknowledges_and_deletes_tasks(
    server: Server, pair: Pair, as_a: redis.Redis, which: str
) -> None:
    stream = pair.a.task_stream() if which == "own" else pair.a.type_stream()
    ensure_group(as_a, stream)
    entry_id = server.admin.xadd(stream, {"message": "task"})

    found: Any = as_a.xreadgroup(GROUP, pair.a.id, {stream: ">"}, count=10, block=1000)

    ids = [entry for _, entries in found for entry, _ in entries]
    assert entry_id in ids
    assert as_a.xack(stream, GROUP, entry_id) == 1
    assert as_a.xdel(stream, entry_id) == 1


def test_agent_reads_its_own_and_its_type_stream_in_one_call(
    server: Server, pair: Pair, as_a: redis.Redis
) -> None:
    streams = [pair.a.task_stream(), pair.a.type_stream()]
    for stream in streams:
        ensure_group(as_a, stream)
        server.admin.xadd(stream, {"message": "task"})

    found: Any = as_a.xreadgroup(GROUP, pair.a.id, dict.fromkeys(streams, ">"), block=1000)

    assert {name.decode() for name, _ in found} == set(streams)


def test_agent_receives_tasks_on_its_own_and_its_type_channel(
    server: Server, pair: Pair, as_a: redis.Redis
) -> None:
    channels = [task_channel(pair.a.id, pair.prefix), task_channel(AGENT_TYPE, pair.prefix)]
    with subscriber(as_a) as pubsub:
        pubsub.subscribe(*channels)
        subscribed = {next_message(pubsub)["channel"].decode() for _ in channels}
        for channel in channels:
            server.admin.publish(channel, f"task on {channel}")
        received = {next_message(pubsub)["data"].decode() for _ in channels}

    assert subscribed == set(channels)
    assert received == {f"task on {channel}" for channel in channels}


def test_agent_writes_acks_to_its_own_ack_stream(
    server: Server, pair: Pair, as_a: redis.Redis
) -> None:
    entry_id = as_a.xadd(
        pair.a.ack_stream(), {"message": "ack"}, maxlen=ACK_MAXLEN, approximate=True
    )

    assert server.admin.xrange(pair.a.ack_stream()) == [(entry_id, {b"message": b"ack"})]


def test_sdk_agent_sets_up_its_groups_and_serves_with_its_credentials(
    server: Server, pair: Pair
) -> None:
    user = new_agent(server, pair.prefix)
    agent = Agent(
        AGENT_TYPE,
        redis_url=f"redis://{user.username}:{user.password}@{HOST}:{server.port}/0",
        agent_id=user.id,
        prefix=user.prefix,
    )
    expired = state_task(datetime.now(UTC) - timedelta(minutes=1))
    cancel = StateCancel(
        machine_id=uuid.uuid4(), state="WRITE_CODE", attempt=4, task_token="0" * 64, reason="x"
    ).to_wire()
    agent._ensure_groups()
    entry_ids = [
        server.admin.xadd(user.task_stream(), {"message": message}) for message in (expired, cancel)
    ]
    taken = agent._take(agent._streams())  # a task past its deadline, a cancel: XACK, XDEL only
    agent._redis().close()

    assert taken == 0
    for entry_id in entry_ids:
        assert server.admin.xrange(user.task_stream(), entry_id, entry_id) == []
    assert server.admin.xpending(user.task_stream(), GROUP)["pending"] == 0


# What an agent may not do -------------------------------------------------------------------


def deny(call: Callable[[], object]) -> None:
    with pytest.raises(redis.exceptions.NoPermissionError):
        call()


@pytest.mark.parametrize("command", ["XREADGROUP", "XRANGE", "XREAD"])
def test_agent_cannot_read_another_agents_tasks(
    server: Server, pair: Pair, connect: Callable[[AgentUser], redis.Redis], command: str
) -> None:
    ensure_group(connect(pair.b), pair.b.task_stream())
    server.admin.xadd(pair.b.task_stream(), {"message": "task for b"})
    as_a, stream = connect(pair.a), pair.b.task_stream()
    reads: dict[str, Callable[[], object]] = {
        "XREADGROUP": lambda: as_a.xreadgroup(GROUP, pair.a.id, {stream: ">"}),
        "XRANGE": lambda: as_a.xrange(stream),
        "XREAD": lambda: as_a.xread({stream: "0"}),
    }

    deny(reads[command])


def test_agent_cannot_subscribe_to_another_agents_channel(pair: Pair, as_a: redis.Redis) -> None:
    with subscriber(as_a) as pubsub:
        pubsub.subscribe(task_channel(pair.b.id, pair.prefix))
        deny(lambda: pubsub.get_message(timeout=2))


def test_agent_cannot_subscribe_to_channel_patterns(pair: Pair, as_a: redis.Redis) -> None:
    with subscriber(as_a) as pubsub:
        pubsub.psubscribe(task_channel(pair.a.id, pair.prefix))
        deny(lambda: pubsub.get_message(timeout=2))


def test_agent_cannot_write_another_agents_acks(pair: Pair, as_a: redis.Redis) -> None:
    deny(lambda: as_a.xadd(pair.b.ack_stream(), {"message": "forged"}))


@pytest.mark.parametrize("command", ["XREADGROUP", "XRANGE", "XREAD", "XGROUP CREATE"])
def test_agent_cannot_read_its_own_ack_stream(pair: Pair, as_a: redis.Redis, command: str) -> None:
    as_a.xadd(pair.a.ack_stream(), {"message": "ack"}, maxlen=ACK_MAXLEN, approximate=True)
    stream = pair.a.ack_stream()
    reads: dict[str, Callable[[], object]] = {
        "XREADGROUP": lambda: as_a.xreadgroup(GROUP, pair.a.id, {stream: ">"}),
        "XRANGE": lambda: as_a.xrange(stream),
        "XREAD": lambda: as_a.xread({stream: "0"}),
        "XGROUP CREATE": lambda: as_a.xgroup_create(stream, GROUP, id="0"),
    }

    deny(reads[command])


def test_agent_cannot_write_the_shared_ack_stream(pair: Pair, as_a: redis.Redis) -> None:
    deny(lambda: as_a.xadd(ack_stream(pair.prefix), {"message": "anonymous"}))


def test_agent_cannot_publish_on_the_shared_ack_channel(pair: Pair, as_a: redis.Redis) -> None:
    deny(lambda: as_a.publish(ack_channel(pair.prefix), "anonymous"))


@pytest.mark.parametrize("which", ["own", "type"])
def test_agent_cannot_add_tasks(pair: Pair, as_a: redis.Redis, which: str) -> None:
    stream = pair.a.task_stream() if which == "own" else pair.a.type_stream()

    deny(lambda: as_a.xadd(stream, {"message": "forged task"}))


@pytest.mark.parametrize("where", ["stream", "type stream", "channel"])
def test_agent_cannot_forge_a_cancel_to_another_agent(
    pair: Pair, as_a: redis.Redis, where: str
) -> None:
    cancel = StateCancel(
        machine_id=uuid.uuid4(),
        state="WRITE_CODE",
        attempt=4,
        task_token="0" * 64,
        reason="pause by nobody",
    ).to_wire()
    if where == "channel":
        deny(lambda: as_a.publish(task_channel(pair.b.id, pair.prefix), cancel))
    else:
        stream = pair.b.task_stream() if where == "stream" else pair.b.type_stream()
        deny(lambda: as_a.xadd(stream, {"message": cancel}))


@pytest.mark.parametrize(
    "command",
    [
        ("KEYS", "*"),
        ("FLUSHALL",),
        ("CONFIG", "GET", "*"),
        ("ACL", "LIST"),
        ("ACL", "SETUSER", "someone", "on", "+@all", "~*"),
        ("DEL", "stream:agent:cto"),
        ("XGROUP", "DESTROY", "stream:agent:cto", GROUP),
    ],
    ids=lambda command: " ".join(command[:2]),
)
def test_agent_cannot_run_anything_else(as_a: redis.Redis, command: tuple[str, ...]) -> None:
    deny(lambda: as_a.execute_command(*command))  # type: ignore[no-untyped-call]


def test_glob_characters_in_the_prefix_match_only_themselves(
    server: Server, connect: Callable[[AgentUser], redis.Redis]
) -> None:
    agent = new_agent(server, "t[1]*:")
    as_agent = connect(agent)
    lookalike = "t1x:"

    ensure_group(as_agent, agent.task_stream())
    deny(lambda: as_agent.xgroup_create(task_stream(agent.id, lookalike), GROUP, mkstream=True))
    deny(lambda: as_agent.xadd(agent_ack_stream(agent.id, lookalike), {"message": "ack"}))
    with subscriber(as_agent) as pubsub:
        pubsub.subscribe(task_channel(agent.id, lookalike))
        deny(lambda: pubsub.get_message(timeout=2))


# What an operator pastes --------------------------------------------------------------------


def test_printed_setuser_line_works_in_redis_cli(
    server: Server, connect: Callable[[AgentUser], redis.Redis]
) -> None:
    agent = AgentUser(str(uuid.uuid4()), "t1:", new_password())
    rules = agent_acl_rules(agent.id, AGENT_TYPE, agent.prefix, agent.password)
    line = acl_setuser_command(agent.id, rules)
    cli = shutil.which("redis-cli")
    assert cli is not None, "redis-cli is not on PATH"

    done = subprocess.run(
        [cli, "-h", HOST, "-p", str(server.port)],
        input=line + "\n",
        capture_output=True,
        text=True,
        check=True,
        timeout=10,
    )

    assert done.stdout.strip() == "OK", done.stdout + done.stderr
    assert agent.password not in line
    as_agent = connect(agent)
    ensure_group(as_agent, agent.task_stream())
    as_agent.xadd(agent.ack_stream(), {"message": "ack"})
    deny(lambda: as_agent.xadd(ack_stream(agent.prefix), {"message": "ack"}))


def test_acl_file_line_loads_at_server_start(tmp_path: Path) -> None:
    agent = AgentUser(str(uuid.uuid4()), "t1:", new_password())
    acl_file = tmp_path / "users.acl"
    rules = agent_acl_rules(agent.id, AGENT_TYPE, agent.prefix, agent.password)
    acl_file.write_text(acl_file_line(agent.id, rules) + "\n")
    process, port = start_redis(tmp_path, "--aclfile", str(acl_file))
    try:
        with redis.Redis(
            host=HOST, port=port, username=agent.username, password=agent.password
        ) as as_agent:
            ensure_group(as_agent, agent.task_stream())
            as_agent.xadd(agent.ack_stream(), {"message": "ack"})
            deny(lambda: as_agent.xrange(agent.ack_stream()))
    finally:
        stop_redis(process)


def test_server_gets_the_optional_commands_it_knows(server: Server) -> None:
    version = tuple(int(part) for part in server.admin.info("server")["redis_version"].split("."))

    known = known_optional_commands(server.admin)

    assert ("client|setinfo" in known) == (version >= (7, 2))


# What the rules refuse to be built from -----------------------------------------------------


@pytest.mark.parametrize(
    ("agent_id", "agent_type", "prefix", "password", "field"),
    [
        ("not-a-uuid", "cto", "", "p" * 43, "agent id"),
        (AN_AGENT, "", "", "p" * 43, "agent type"),
        (AN_AGENT, "researchers", "", "p" * 43, "agent type"),
        (AN_AGENT, "c*o", "", "p" * 43, "agent type"),
        (AN_AGENT, "cto", "my prefix:", "p" * 43, "channel prefix"),
        (AN_AGENT, "cto", 'a"b:', "p" * 43, "channel prefix"),
        (AN_AGENT, "cto", "", "short", "password"),
    ],
)
def test_rules_refuse_bad_input(
    agent_id: str, agent_type: str, prefix: str, password: str, field: str
) -> None:
    with pytest.raises(ValueError, match=rf"^{field}: expected"):
        agent_acl_rules(agent_id, agent_type, prefix, password)


def test_an_agent_whose_user_may_not_wait_still_answers(server: Server) -> None:
    """FSM_REDIS_REPLICAS set, but the agent's user was made before it (no WAIT, no ROLE): its
    answers go out unconfirmed, with a warning, rather than not at all."""
    user = new_agent(server, "")
    rules = [
        r
        for r in agent_acl_rules(user.id, AGENT_TYPE, "", user.password)
        if r not in ("+wait", "+role")
    ]
    server.admin.execute_command(  # type: ignore[no-untyped-call]
        "ACL SETUSER", user.username, *rules
    )
    agent = Agent(
        AGENT_TYPE,
        redis_url=f"redis://{user.username}:{user.password}@{HOST}:{server.port}/0",
        agent_id=user.id,
        replicas=1,
    )
    agent._ensure_groups()
    added = server.admin.xadd(user.task_stream(), {"message": "x"})
    entry = added.decode() if isinstance(added, bytes) else added
    agent._done(user.task_stream(), entry, {"type": "state_ack", "note": "sent"})
    agent._redis().close()
    sent: Any = server.admin.xrange(user.ack_stream())
    assert len(sent) == 1 and b"sent" in sent[0][1][b"message"]  # once: not re-sent in a loop
    assert server.admin.xrange(user.task_stream(), entry, entry) == []
