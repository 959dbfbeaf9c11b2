"""Settings from the environment, all prefixed FSM_."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from fsm_celery.exceptions import InsecureSecret

DEFAULT_SECRET = "change-me-in-production"
MIN_SECRET_BYTES = 32


class Settings(BaseSettings):
    """Everything a process of fsm-celery needs to know about its surroundings."""

    model_config = SettingsConfigDict(env_prefix="FSM_", frozen=True)

    database_url: str = "postgresql+psycopg2://postgres@127.0.0.1:5432/fsm_celery"
    redis_url: str = "redis://127.0.0.1:6379/0"
    broker_url: str | None = None
    channel_prefix: str = ""
    queue: str = "fsm"
    definitions_path: str | None = None
    # Comma-separated: the first signs task tokens, all are accepted (rotate by prepending).
    task_token_secret: str = DEFAULT_SECRET
    accept_unsigned_acks: bool = False
    # The seed's shared ack channel and stream carry no identity: anyone who can write to
    # Redis can answer for any machine there. Off, only per-agent ack streams are read.
    accept_shared_acks: bool = True
    task_streams: bool = True
    # celery: the bridge hands each batch of acks to an fsm.apply_acks task, which enqueues an
    # fsm.enter_state task per state entered (Flower shows every step). inline: the bridge
    # applies the batch and sends the next state_tasks itself (fewer hops, lower latency).
    transition_mode: Literal["celery", "inline"] = "celery"
    # How long a state entry handed to an fsm.enter_state task is left to it before the scan
    # enters the state itself (a task lost with its worker is repaired after this).
    dispatch_grace_seconds: float = Field(default=5.0, ge=0)
    # The most bytes of agent messages one fsm.apply_acks task carries (a batch is split).
    max_relay_bytes: int = Field(default=4_194_304, gt=0)
    # In the celery mode, how long the bridge lets a short batch gather before it hands it to
    # a task: a task costs the worker about as much as the acks it applies, so fuller tasks
    # carry more transitions; at most this is added to each transition's latency.
    relay_linger_ms: float = Field(default=5.0, ge=0, le=1000)
    stream_claim_idle_seconds: float = Field(default=30.0, gt=0)
    agent_liveness_seconds: float = Field(default=15.0, gt=0)
    visibility_timeout_seconds: int = Field(default=60, ge=5)
    max_payload_bytes: int = Field(default=1_048_576, gt=0)
    ack_batch_size: int = Field(default=500, gt=0)
    scan_interval_seconds: float = Field(default=1.0, gt=0)
    # How often beat looks for due schedule ticks (a tick is late by at most this).
    schedule_interval_seconds: float = Field(default=1.0, gt=0)
    max_context_bytes: int = Field(default=524_288, gt=0)
    max_prompt_bytes: int = Field(default=131_072, gt=0)
    max_attempt_seconds: float = Field(default=86_400.0, gt=0)
    max_handbacks: int = Field(default=3, ge=0)
    dead_letter_after: int = Field(default=3, ge=1)
    ack_stream_maxlen: int = Field(default=100_000, ge=100)
    rejected_retention_days: float = Field(default=7.0, gt=0)
    agent_retention_days: float = Field(default=7.0, gt=0)

    @property
    def definitions(self) -> Path:
        """The definitions folder (or file): FSM_DEFINITIONS_PATH, else the shipped ones."""
        from fsm_celery.core.loader import SHIPPED_DEFINITIONS

        return Path(self.definitions_path) if self.definitions_path else SHIPPED_DEFINITIONS

    @property
    def celery_broker_url(self) -> str:
        return self.broker_url or self.redis_url

    @property
    def token_secrets(self) -> tuple[str, ...]:
        """The accepted task token secrets; the first signs."""
        return tuple(s.strip() for s in self.task_token_secret.split(",") if s.strip()) or ("",)

    def secret_problem(self) -> str | None:
        """Why the task token secrets are unfit for a deployment, or None."""
        for secret in self.token_secrets:
            if secret == DEFAULT_SECRET:
                return "FSM_TASK_TOKEN_SECRET is the default"
            if len(secret.encode()) < MIN_SECRET_BYTES:
                return f"FSM_TASK_TOKEN_SECRET is shorter than {MIN_SECRET_BYTES} bytes"
        return None

    def require_secret(self) -> None:
        """Refuse to run a long-lived process with a guessable task token secret."""
        problem = self.secret_problem()
        if problem is not None:
            raise InsecureSecret(problem)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The settings of this process, read once from the environment."""
    return Settings()
