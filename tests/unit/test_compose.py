"""docker-compose.yml: no published port without a password, no secret with a default."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from celery.bin.celery import celery as celery_cli

from fsm_celery import cli as fsm_cli
from fsm_celery.config import Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
LOOPBACK = "127.0.0.1"
ONE_SHOT = frozenset({"migrate"})  # runs to completion: there is nothing to keep healthy

# Compose's interpolation: ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?error},
# ${NAME?error}, ${NAME:+other}, ${NAME+other}; $$ escapes a dollar.
_REFERENCE = re.compile(r"(?<!\$)\$\{(?P<name>\w+)(?P<op>:?[-?+])?(?P<arg>[^}]*)\}")
# [HOST:]PUBLISHED:TARGET[/PROTOCOL], where HOST and PUBLISHED may be references with a colon.
_PORT = re.compile(
    r"(?:(?P<host>.+):)?(?P<published>\$\{[^}]*\}|[\d-]+):(?P<target>[\d-]+)(?:/\w+)?"
)
_REDIS_URL = re.compile(r"rediss?://")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return document


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = compose["services"]
    return found


def test_every_published_port_binds_to_loopback_unless_the_operator_says_otherwise(
    services: dict[str, dict[str, Any]],
) -> None:
    published = [(name, port) for name, service in services.items() for port in ports(service)]
    assert published, "expected Redis and Flower to publish their ports"
    for name, port in published:
        host = published_host(port)
        assert host == LOOPBACK or re.fullmatch(rf"\$\{{\w+:-{re.escape(LOOPBACK)}\}}", host), (
            f"{name}: port {port!r} binds to {host or 'every address'!r}, "
            f"expected {LOOPBACK} or ${{VAR:-{LOOPBACK}}}"
        )


def test_flower_takes_basic_auth_from_the_environment_without_a_default(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    basic_auth = environment(services["flower"]).get("FLOWER_BASIC_AUTH", "")
    assert_required(compose, sole_reference(basic_auth))


def test_redis_requires_a_password_without_a_default(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    assert_required(compose, redis_password(services))


def test_every_redis_url_carries_the_redis_password(
    services: dict[str, dict[str, Any]],
) -> None:
    password = redis_password(services)
    carrying = re.compile(rf"rediss?://[^:@/]*:\$\{{{password}:\?[^}}]*\}}@.+")
    urls = {
        (name, key): value
        for name, service in services.items()
        for key, value in environment(service).items()
        if _REDIS_URL.match(value)
    }
    assert {"worker", "beat", "ack-bridge", "flower"} <= {name for name, _ in urls}
    for (name, key), url in urls.items():
        assert carrying.fullmatch(url), f"{name}: {key}={url!r} does not carry ${{{password}}}"


def test_redis_never_evicts_broker_messages(services: dict[str, dict[str, Any]]) -> None:
    assert option(services["redis"], "--maxmemory-policy") == "noeviction"


def test_postgres_password_has_no_default(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    password = environment(services["postgres"]).get("POSTGRES_PASSWORD", "")
    assert_required(compose, sole_reference(password))


def test_every_database_url_carries_the_postgres_password(
    services: dict[str, dict[str, Any]],
) -> None:
    password = sole_reference(environment(services["postgres"])["POSTGRES_PASSWORD"])
    urls = {
        name: env["FSM_DATABASE_URL"]
        for name, service in services.items()
        if "FSM_DATABASE_URL" in (env := environment(service))
    }
    assert {"migrate", "worker", "beat", "ack-bridge"} <= urls.keys()
    for name, url in urls.items():
        assert f":${{{password}:?" in url, f"{name}: {url!r} does not carry ${{{password}}}"


def test_task_token_secret_has_no_default(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    secrets = {
        name: env["FSM_TASK_TOKEN_SECRET"]
        for name, service in services.items()
        if "FSM_TASK_TOKEN_SECRET" in (env := environment(service))
    }
    assert {"worker", "ack-bridge"} <= secrets.keys()
    for secret in secrets.values():
        assert sole_reference(secret) == "FSM_TASK_TOKEN_SECRET"
    assert_required(compose, "FSM_TASK_TOKEN_SECRET")


def test_every_long_running_service_has_a_healthcheck(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, service in services.items():
        if name in ONE_SHOT:
            continue
        check = service.get("healthcheck") or {}
        assert not check.get("disable") and check.get("test") not in (None, "NONE", ["NONE"]), (
            f"{name}: expected a healthcheck"
        )


def test_env_example_lists_every_required_variable(compose: dict[str, Any]) -> None:
    listed = set(re.findall(r"^(\w+)=", ENV_EXAMPLE.read_text(), flags=re.MULTILINE))
    required = {m["name"] for m in references(compose) if m["op"] == ":?"}
    assert required, "expected the compose file to require its secrets"
    assert required <= listed, f"missing from .env.example: {sorted(required - listed)}"


def test_every_command_the_project_image_runs_exists(
    services: dict[str, dict[str, Any]],
) -> None:
    """A renamed subcommand or option fails here, not in an operator's `docker compose up`."""
    checked = 0
    for name, service in services.items():
        if service.get("build") != ".":
            continue
        command = service["command"]
        lines = shlex.split(command[2]) if command[:2] == ["sh", "-c"] else list(command)
        for argv in _split_on_and(lines):
            assert_runs(name, argv)
            checked += 1
        test = service.get("healthcheck", {}).get("test", [])
        if test[:1] == ["CMD-SHELL"] and "celery" in test[1]:
            assert_runs(name, shlex.split(test[1].split("|")[0]))
            checked += 1
    assert checked >= 6


def test_a_mock_agent_serves_every_shipped_type_only_when_asked_for(
    services: dict[str, dict[str, Any]],
) -> None:
    agent = services["mock-agent"]
    assert agent["command"] == ["fsm-celery", "agent", "--mock"]
    assert agent["profiles"] == ["mock-agent"]  # made-up outputs: never in production unasked
    assert "migrate" in agent["depends_on"]  # the definitions it serves are loaded first
    assert _REDIS_URL.match(environment(agent)["FSM_REDIS_URL"])


def test_every_fsm_variable_the_file_sets_is_a_setting(
    services: dict[str, dict[str, Any]],
) -> None:
    known = {f"FSM_{name.upper()}" for name in Settings.model_fields}
    for name, service in services.items():
        for key in environment(service):
            if key.startswith("FSM_"):
                assert key in known, f"{name}: {key} is not a setting (fsm_celery/config.py)"


def _split_on_and(argv: list[str]) -> Iterator[list[str]]:
    part: list[str] = []
    for word in argv:
        if word == "&&":
            yield part
            part = []
        else:
            part.append(word)
    yield part


def assert_runs(service: str, argv: list[str]) -> None:
    """argv names a command of fsm-celery, or of Celery's CLI with the project's app, with
    options those commands take."""
    program, *rest = argv
    if program == "fsm-celery":
        group: click.Command = fsm_cli.main
    elif program == "celery":
        assert rest[:2] == ["-A", "fsm_celery"], f"{service}: {argv} does not load fsm_celery"
        rest = rest[2:]
        group = celery_cli
    else:
        raise AssertionError(f"{service}: {program} is neither fsm-celery nor celery")
    context = click.Context(group)
    words = list(rest)
    while isinstance(group, click.Group) and words and words[0] in group.list_commands(context):
        group = group.get_command(context, words.pop(0))  # type: ignore[assignment]
    assert not isinstance(group, click.Group) or (
        program == "celery" and group is not celery_cli
    ), f"{service}: {argv} names no command"
    accepted = {opt for param in group.params for opt in getattr(param, "opts", [])}
    if any(param.name == "tornado_argv" for param in group.params):  # Flower's own options
        import flower.options  # noqa: F401  (defines them)
        from tornado.options import options

        accepted |= {f"--{name}" for name in options._options}
    for word in words:
        flag = word.split("=", 1)[0]
        if flag.startswith("-"):
            assert flag in accepted, f"{service}: {argv}: {flag} is not an option of it"


def strings(node: Any) -> Iterator[str]:
    """Every string value in a parsed YAML document."""
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for value in node.values():
            yield from strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from strings(item)


def references(compose: dict[str, Any]) -> list[re.Match[str]]:
    """Every ${…} interpolation in the compose file's values."""
    return [match for text in strings(compose) for match in _REFERENCE.finditer(text)]


def assert_required(compose: dict[str, Any], name: str) -> None:
    """Every use of the variable is ${NAME:?…}: compose stops when it is unset or empty."""
    uses = [m.group(0) for m in references(compose) if m["name"] == name]
    assert uses, f"expected ${{{name}:?…}} in the compose file"
    for use in uses:
        assert use.startswith(f"${{{name}:?"), f"{use}: expected no default, ${{{name}:?…}}"


def sole_reference(value: str) -> str:
    """The variable a value consists of, ${NAME…} and nothing else."""
    match = _REFERENCE.fullmatch(value)
    assert match, f"{value!r}: expected a ${{VAR:?…}} reference, not a literal"
    return match["name"]


def redis_password(services: dict[str, dict[str, Any]]) -> str:
    """The variable Redis takes its password from."""
    return sole_reference(option(services["redis"], "--requirepass"))


def option(service: dict[str, Any], flag: str) -> str:
    """The argument following the flag in a service's command."""
    command = service.get("command", [])
    words = command.split() if isinstance(command, str) else [str(word) for word in command]
    assert flag in words[:-1], f"expected {flag} VALUE in the command {command!r}"
    return words[words.index(flag) + 1]


def environment(service: dict[str, Any]) -> dict[str, str]:
    """A service's environment, whether written as a mapping or as KEY=VALUE items."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) for item in env if "=" in item)
    return {str(key): str(value) for key, value in env.items()}


def ports(service: dict[str, Any]) -> list[str | int | dict[str, Any]]:
    """A service's published ports, in short (HOST:PUBLISHED:TARGET) or long syntax."""
    found: list[str | int | dict[str, Any]] = service.get("ports") or []
    return found


def published_host(port: str | int | dict[str, Any]) -> str:
    """The host address a published port binds to ('' for every address)."""
    if isinstance(port, dict):
        return str(port.get("host_ip", ""))
    match = _PORT.fullmatch(str(port))
    return (match["host"] or "") if match else ""


def test_rabbitmq_runs_only_with_its_profile_and_publishes_no_port(
    services: dict[str, dict[str, Any]],
) -> None:
    rabbitmq = services["rabbitmq"]
    assert rabbitmq["profiles"] == ["rabbitmq"]
    assert rabbitmq["image"].startswith("rabbitmq:3.13")  # quorum queues, at-least-once DLX
    assert ports(rabbitmq) == []  # only the services on the compose network reach it
    assert sole_reference(environment(rabbitmq)["RABBITMQ_DEFAULT_PASS"]) == "RABBITMQ_PASSWORD"
    assert "rabbitmqdata:/var/lib/rabbitmq" in rabbitmq["volumes"]  # the queues survive it


def test_every_celery_process_takes_the_broker_url_empty_meaning_redis(
    services: dict[str, dict[str, Any]],
) -> None:
    given = {
        name
        for name, service in services.items()
        if environment(service).get("FSM_BROKER_URL") == "${FSM_BROKER_URL:-}"
    }
    assert {"worker", "beat", "ack-bridge", "flower", "dashboard", "migrate"} <= given
    assert Settings(broker_url="").broker_url is None  # unset: Celery's broker is FSM_REDIS_URL
    on_rabbitmq = Settings(broker_url="amqp://fsm:pw@rabbitmq:5672/fsm")
    assert on_rabbitmq.broker_is_amqp
    assert on_rabbitmq.celery_transport_options == {"confirm_publish": True}


def test_env_example_shows_the_rabbitmq_profiles_lines() -> None:
    text = ENV_EXAMPLE.read_text()
    assert "# RABBITMQ_PASSWORD=" in text
    assert "# FSM_BROKER_URL=amqp://fsm:RABBITMQ_PASSWORD@rabbitmq:5672/fsm" in text
