"""Per-agent Redis ACL users: who wrote an ack is who could write to that ack stream.

Each agent gets its own Redis user. It may read, acknowledge and delete entries of its own task
stream and of its agent type's task stream (through the consumer group, never by XRANGE),
subscribe to the two matching task channels, and XADD to its own ack stream
`PREFIXstream:state:ack:<id>` — write-only, so it cannot read another agent's acks or its own.
It cannot touch the shared ack stream or channel, add tasks, or run anything else.

Every builder here is pure; create_agent_user, restore_users and the deletions talk to Redis. The
rules are built for Redis 7.0+ (root permissions plus one selector) and store a SHA-256 of the
password, so a printed rule never carries it in clear.

Redis ACLs cannot keep a user in one database: key patterns hold in every database, and SELECT
is all or nothing. So an agent of a deployment in database 0 is denied SELECT (it cannot reach
another database at all), and one in any other database, which needs SELECT to reach its own,
is issued only under a channel prefix of its own: whatever it writes in another database lands
under its prefix, which no other deployment reads, and it can read nothing there.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from collections.abc import Iterable, Mapping, Sequence
from uuid import UUID

import redis

from fsm_celery.core.messages import agent_ack_stream, task_channel, task_stream
from fsm_celery.redis_address import is_sentinel, parse_sentinel

MAX_AGENT_TYPE = 10
MIN_PASSWORD = 16
USER_PREFIX = "fsm-agent-"  # an agent's Redis user is this and its id
RESTORE_SECONDS = 2.0  # how often the bridge creates again the agents' users Redis lost

_AGENT_TYPE = re.compile(rf"[A-Za-z0-9_-]{{1,{MAX_AGENT_TYPE}}}")
# A rule must stay one token both in redis-cli (which splits on blanks and honours quotes) and
# in an ACL file (which splits on blanks only).
_UNSAFE_IN_PREFIX = re.compile(r"[\s\"'\x00-\x1f\x7f]")
_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")

# What an agent sends, beyond XADD to its ack stream (granted by a selector of its own).
COMMANDS = (
    "xreadgroup",  # read tasks through the group `agents` (Redis 7.0 asks read on the key)
    "xack",  # acknowledge a task once its ack is sent (needs write)
    "xdel",  # drop the answered entry (needs write)
    "xgroup|create",  # with MKSTREAM: the group exists before the first task (needs write)
    "subscribe",  # the seed's way of receiving tasks
    "unsubscribe",
    "ping",  # health checks, also on a subscribed connection
    "hello",  # redis-py 8 connects with HELLO 3 AUTH
    "auth",  # RESP2 clients
    "quit",  # clients that say goodbye (ioredis, node-redis)
    "client|setname",  # clients given a connection name (client_name=…)
    "wait",  # an answer held by the replicas before it counts as sent (FSM_REDIS_REPLICAS)
    "role",  # how many replicas the primary has, to wait for no more (channel.redis)
)
# redis-py 8 also sends these on connect and ignores a refusal, but a refusal fills ACL LOG.
# Redis 7.0 knows neither, and ACL SETUSER refuses a command it does not know.
OPTIONAL_COMMANDS = ("client|setinfo", "client|maint_notifications")


def database_of(redis_url: str) -> int:
    """The database a Redis URL selects (redis-py's reading of it; a Sentinel URL's own)."""
    if is_sentinel(redis_url):
        return parse_sentinel(redis_url).db
    kwargs = redis.connection.parse_url(redis_url)  # type: ignore[no-untyped-call]
    return int(kwargs.get("db") or 0)


def agent_username(agent_id: UUID | str) -> str:
    """The Redis user of an agent."""
    return f"{USER_PREFIX}{_agent_id(agent_id)}"


def new_password() -> str:
    """A fresh random password for an agent user (43 URL-safe characters)."""
    return secrets.token_urlsafe(32)


def password_hash(password: str) -> str:
    """The `#<sha256>` rule that sets a password without writing it in clear."""
    if len(password) < MIN_PASSWORD:
        raise ValueError(
            f"password: expected at least {MIN_PASSWORD} characters, got {len(password)}: "
            "whoever guesses it can send acks as the agent (use new_password())"
        )
    return "#" + hashlib.sha256(password.encode()).hexdigest()


def glob_escape(text: str) -> str:
    """The text as a Redis glob pattern that matches only itself."""
    return _GLOB_SPECIAL.sub(r"\\\1", text)


def agent_acl_rules(
    agent_id: UUID | str,
    agent_type: str,
    prefix: str,
    password: str,
    *,
    optional_commands: Iterable[str] = (),
    database: int = 0,
) -> list[str]:
    """The ACL SETUSER rule tokens of an agent user of a deployment in `database`
    (optional_commands: see OPTIONAL_COMMANDS)."""
    agent = str(_agent_id(agent_id))
    _check_agent_type(agent_type)
    _check_prefix(prefix, database)
    # redis-py sends SELECT n when the URL names database n > 0; in 0, SELECT is only a way out.
    select = ["select"] if database else []
    commands = [*COMMANDS, *select, *_optional(optional_commands)]
    return [
        "reset",
        "on",
        password_hash(password),
        "resetchannels",  # `reset` grants every channel when acl-pubsub-default is allchannels
        "&" + glob_escape(task_channel(agent, prefix)),
        "&" + glob_escape(task_channel(agent_type, prefix)),
        "-@all",
        *(f"+{command}" for command in commands),
        "%RW~" + glob_escape(task_stream(agent, prefix)),
        "%RW~" + glob_escape(task_stream(agent_type, prefix)),
        # A selector of its own, so XADD reaches the ack stream and nothing else: not the task
        # streams (no forged tasks). Only XADD: `%W~` alone does not hide entries, as Redis 7.0
        # lets XAUTOCLAIM and XCLAIM return them with write permission only.
        f"(+xadd %W~{glob_escape(agent_ack_stream(agent, prefix))})",
    ]


def acl_setuser_command(agent_id: UUID | str, rules: Sequence[str]) -> str:
    """The `ACL SETUSER …` line an operator pastes into redis-cli, of the agent's rules
    (agent_acl_rules)."""
    return " ".join(["ACL SETUSER", agent_username(agent_id), *rules])


def acl_file_line(agent_id: UUID | str, rules: Sequence[str]) -> str:
    """The `user …` line of the agent in a Redis ACL file (aclfile), of its rules."""
    return " ".join(["user", agent_username(agent_id), *rules])


def create_agent_user(
    admin: redis.Redis, agent_id: UUID | str, agent_type: str, prefix: str, password: str
) -> list[str]:
    """Create the agent's Redis user, or replace its rules and password (ACL SETUSER), for
    the database the admin client uses; its rules (the password hashed: what to keep)."""
    rules = agent_acl_rules(
        agent_id,
        agent_type,
        prefix,
        password,
        optional_commands=known_optional_commands(admin),
        database=int(admin.connection_pool.connection_kwargs.get("db") or 0),
    )
    admin.execute_command(  # type: ignore[no-untyped-call]
        "ACL SETUSER", agent_username(agent_id), *rules
    )
    return rules


def restore_users(admin: redis.Redis, users: Mapping[UUID, list[str]]) -> list[str]:
    """Create again the agents' users this Redis does not have (it restarted without an
    aclfile, or it is a replica Sentinel promoted: ACL users are not replicated); the names
    created. Users it has are left as they are."""
    if not users:
        return []
    present = {
        name.decode() if isinstance(name, bytes) else name
        for name in admin.execute_command("ACL USERS")  # type: ignore[no-untyped-call]
    }
    created = []
    for agent_id, rules in users.items():
        name = agent_username(agent_id)
        if name not in present:
            admin.execute_command("ACL SETUSER", name, *rules)  # type: ignore[no-untyped-call]
            created.append(name)
    return created


def delete_agent_user(admin: redis.Redis, agent_id: UUID | str) -> bool:
    """Delete the agent's Redis user, which also closes every connection it authenticated;
    whether it existed. Called again RESTORE_SECONDS later by a revocation: a bridge that read
    the rules just before they were forgotten may create the user once more meanwhile."""
    deleted = admin.execute_command(  # type: ignore[no-untyped-call]
        "ACL DELUSER", agent_username(agent_id)
    )
    return bool(deleted)


def revoke_agent_user(admin: redis.Redis, agent_id: UUID | str) -> bool:
    """Delete the agent's Redis user now and once more after the bridge's next check (whose
    rules were forgotten before: see delete_agent_user); whether it existed."""
    existed = delete_agent_user(admin, agent_id)
    time.sleep(RESTORE_SECONDS + 0.5)
    return delete_agent_user(admin, agent_id) or existed


def known_optional_commands(admin: redis.Redis) -> list[str]:
    """The OPTIONAL_COMMANDS this server knows (COMMAND INFO answers nil for the others)."""
    # "COMMAND INFO" as one name skips redis-py's reply parser, which fails on a nil entry.
    infos = admin.execute_command(  # type: ignore[no-untyped-call]
        "COMMAND INFO", *OPTIONAL_COMMANDS
    )
    return [name for name, info in zip(OPTIONAL_COMMANDS, infos, strict=True) if info]


def _agent_id(agent_id: UUID | str) -> UUID:
    if isinstance(agent_id, UUID):
        return agent_id
    try:
        return UUID(agent_id)
    except (ValueError, TypeError, AttributeError) as exc:
        raise ValueError(f"agent id: expected a UUID, got {agent_id!r}") from exc


def _check_agent_type(agent_type: str) -> None:
    if not _AGENT_TYPE.fullmatch(agent_type):
        raise ValueError(
            f"agent type: expected 1 to {MAX_AGENT_TYPE} characters of A-Z, a-z, 0-9, _ "
            f"and -, got {agent_type!r}"
        )


def _check_prefix(prefix: str, database: int) -> None:
    if _UNSAFE_IN_PREFIX.search(prefix):
        raise ValueError(
            f"channel prefix: expected no blanks, quotes or control characters (the ACL rule "
            f"must stay one token), got {prefix!r}"
        )
    if database and not prefix:
        raise ValueError(
            f"channel prefix: a deployment in Redis database {database} needs an "
            "FSM_CHANNEL_PREFIX of its own (Redis ACLs cannot keep an agent in one database: "
            "without one it reaches another deployment's keys)"
        )


def _optional(commands: Iterable[str]) -> list[str]:
    chosen = [command.lower() for command in commands]
    unknown = sorted(set(chosen) - set(OPTIONAL_COMMANDS))
    if unknown:
        raise ValueError(
            f"optional commands: expected some of {', '.join(OPTIONAL_COMMANDS)}, "
            f"got {', '.join(unknown)}"
        )
    return [command for command in OPTIONAL_COMMANDS if command in chosen]
