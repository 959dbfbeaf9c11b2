"""Settings from the environment, all prefixed FSM_."""

from __future__ import annotations

from functools import lru_cache

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Everything a process of fsm-celery needs to know about its surroundings."""

    model_config = SettingsConfigDict(env_prefix="FSM_", frozen=True)

    database_url: str = "postgresql+psycopg2://postgres@127.0.0.1:5432/fsm_celery"
    redis_url: str = "redis://127.0.0.1:6379/0"
    broker_url: str | None = None
    channel_prefix: str = ""
    queue: str = "fsm"
    definitions_path: str = "definitions"
    task_token_secret: str = "change-me-in-production"
    accept_unsigned_acks: bool = False
    task_streams: bool = True
    stream_claim_idle_seconds: float = Field(default=30.0, gt=0)
    agent_liveness_seconds: float = Field(default=15.0, gt=0)
    visibility_timeout_seconds: int = Field(default=60, ge=5)
    max_payload_bytes: int = Field(default=1_048_576, gt=0)
    ack_batch_size: int = Field(default=500, gt=0)
    scan_interval_seconds: float = Field(default=1.0, gt=0)

    @property
    def celery_broker_url(self) -> str:
        return self.broker_url or self.redis_url


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The settings of this process, read once from the environment."""
    return Settings()
