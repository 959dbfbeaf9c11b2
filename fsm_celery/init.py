"""`fsm-celery init DIR`: a starter deployment folder, the shipped definitions and a .env."""

from __future__ import annotations

import secrets
import shutil
from pathlib import Path

from fsm_celery.core.loader import SHIPPED_DEFINITIONS, definition_files
from fsm_celery.exceptions import FsmError

ENV_TEMPLATE = """\
# fsm-celery settings (every one: README.md, "Configuration"). Run every command from this
# folder (the relative paths below are read from the working directory), with these settings
# loaded into the shell:
#   set -a; . ./.env; set +a
# or give this file to docker compose (env_file: .env) or systemd (EnvironmentFile=, with
# WorkingDirectory= this folder). The secrets and tokens below were generated for this folder.

# PostgreSQL holds the machines (postgresql:// or postgres://; sqlite:///PATH is embedded).
# A database that does not exist yet: fsm-celery db upgrade --create
FSM_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/fsm_celery
# Redis carries the agents' tasks and acks, and is Celery's broker (rediss:// for TLS).
FSM_REDIS_URL=redis://127.0.0.1:6379/0
# Signs the task tokens agents echo in their acks: keep it secret, rotate by prepending a new
# one (comma-separated).
FSM_TASK_TOKEN_SECRET={secret}
# The dashboard and HTTP API (fsm-celery dashboard): sign in, or send Authorization: Bearer,
# with the admin token to read and act, with the viewer token to read.
FSM_ADMIN_TOKEN={admin}
FSM_VIEWER_TOKEN={viewer}
# Flower (celery -A fsm_celery flower) serves only behind this user:password.
FLOWER_BASIC_AUTH=ops:{flower}
# The definitions this deployment runs: edit them, then `fsm-celery definitions load`.
FSM_DEFINITIONS_PATH=definitions
# Where beat keeps its schedule (celerybeat-schedule).
FSM_STATE_DIR=state
# celery: every step is a Celery task (Flower shows it); inline: the ack bridge applies acks
# itself (fewer hops, lower latency).
FSM_TRANSITION_MODE=celery
"""


class InitRefused(FsmError):
    """init would overwrite files."""


def init(directory: Path, force: bool = False) -> list[Path]:
    """Write DIR/definitions (the shipped definitions) and DIR/.env; the files written.
    Refuses to overwrite an existing file unless force."""
    directory = directory.resolve()
    definitions = directory / "definitions"
    targets = {definitions / p.name: p for p in definition_files(SHIPPED_DEFINITIONS)}
    env = directory / ".env"
    existing = [p for p in (*targets, env) if p.exists()]
    if existing and not force:
        raise InitRefused(
            f"{existing[0]} exists ({len(existing)} of the files init writes do): "
            "pass --force to overwrite them"
        )
    definitions.mkdir(parents=True, exist_ok=True)
    for target, source in targets.items():
        shutil.copyfile(source, target)
    env.write_text(
        ENV_TEMPLATE.format(
            secret=secrets.token_hex(32),
            admin=secrets.token_urlsafe(32),  # shell-safe: letters, digits, - and _
            viewer=secrets.token_urlsafe(32),
            flower=secrets.token_hex(16),  # no ':' nor ',', which basic auth's list splits on
        )
    )
    env.chmod(0o600)  # it holds the secret
    return [*targets, env]
