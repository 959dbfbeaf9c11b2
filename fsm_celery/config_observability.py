"""The settings of what operators watch: the Prometheus metrics every long-running process
serves (FSM_METRICS_*) and the bounds the fleet-wide gauges are computed with. A part of
fsm_celery.config.Settings (its base), declared here as there: each setting's docstring is its
description."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ObservabilitySettings(BaseSettings):
    """The observability part of the settings (FSM_METRICS_*, FSM_APPROVAL_SLA_FRACTION)."""

    model_config = SettingsConfigDict(env_prefix="FSM_", frozen=True)

    metrics_port: int = Field(default=0, ge=0, le=65535)
    """The port a worker, beat, an ack bridge or an SDK agent serves Prometheus's /metrics on (0:
    none, and nothing counted). Each process on one host needs its own: set it per process."""
    metrics_address: str = Field(default="127.0.0.1", max_length=255)
    """The address that /metrics listens on (0.0.0.0 for a Prometheus on another host)."""
    metrics_token: str = Field(default="", max_length=4096)
    """A bearer token that the dashboard's GET /metrics accepts besides a viewer's or an
    admin's (Prometheus's `authorization: {credentials: ...}`); empty: only theirs."""
    approval_sla_fraction: float = Field(default=0.5, gt=0, le=1)
    """The part of an approval gate's deadline after which fsm_approvals_past_sla counts it."""
