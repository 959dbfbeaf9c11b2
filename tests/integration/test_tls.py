"""Acceptance: every connection works over TLS (rediss://): the client, the worker's broker, the
bridge and an SDK agent, against a redis-server that speaks only TLS."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fsm_celery.agent.sdk import Agent, Task
from tests.support.agents import serving
from tests.support.processes import FsmEnv
from tests.support.services import free_port, start_redis, stop_redis


def _certificates(directory: Path) -> dict[str, Path]:
    """A certificate authority and a server certificate for 127.0.0.1, made with openssl."""
    paths = {
        name: directory / name for name in ("ca.key", "ca.crt", "tls.key", "tls.csr", "tls.crt")
    }
    ext = directory / "san.ext"
    ext.write_text("subjectAltName = IP:127.0.0.1\n")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=fsm-test-ca",
        "-keyout",
        str(paths["ca.key"]),
        "-out",
        str(paths["ca.crt"]),
    )
    openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        str(paths["tls.key"]),
        "-out",
        str(paths["tls.csr"]),
    )
    openssl(
        "x509",
        "-req",
        "-in",
        str(paths["tls.csr"]),
        "-CA",
        str(paths["ca.crt"]),
        "-CAkey",
        str(paths["ca.key"]),
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        str(ext),
        "-out",
        str(paths["tls.crt"]),
    )
    return paths


@pytest.fixture(scope="module")
def tls(
    env_factory: Callable[..., FsmEnv], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FsmEnv]:
    directory = tmp_path_factory.mktemp("redis-tls")
    certs = _certificates(directory)
    port = free_port()
    process, _ = start_redis(
        directory,
        *("--port", "0", "--tls-port", str(port), "--tls-auth-clients", "no"),
        *("--tls-cert-file", str(certs["tls.crt"]), "--tls-key-file", str(certs["tls.key"])),
        *("--tls-ca-cert-file", str(certs["ca.crt"])),
        port=port,
        tls_ca=certs["ca.crt"],
    )
    url = f"rediss://127.0.0.1:{port}/0?ssl_cert_reqs=required&ssl_ca_certs={certs['ca.crt']}"
    try:
        env = env_factory("tls", redis_url=url)
        env.start_worker()
        env.start_bridge()
        yield env
        env.stop_all()
    finally:
        stop_redis(process)


def test_a_machine_runs_to_the_end_over_tls(tls: FsmEnv) -> None:
    agent = Agent("tester", redis_url=tls.settings.redis_url, prefix=tls.settings.channel_prefix)

    @agent.handler("test_pair")
    def answer(task: Task) -> dict[str, Any]:
        return {"first": 1, "second": 2}

    with serving(agent):
        mid = tls.client.start_machine("test_pair", {}, agent_id=agent.id)
        assert tls.wait_until_done(mid).status == "completed"
