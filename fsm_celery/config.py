"""Settings from the environment, all prefixed FSM_."""

from __future__ import annotations

import hashlib
import os
import re
from enum import StrEnum
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from fsm_celery import urls
from fsm_celery.config_agents import AgentSettings
from fsm_celery.config_observability import ObservabilitySettings
from fsm_celery.exceptions import InsecureSecret
from fsm_celery.redis_address import is_sentinel, kombu_options, kombu_url, parse_sentinel
from fsm_celery.secret_strength import weak_secret

DEFAULT_SECRET = "change-me-in-production"
MIN_SECRET_BYTES = 32


class TransitionMode(StrEnum):
    """Who applies agents' acks and enters the next states (FSM_TRANSITION_MODE)."""

    CELERY = "celery"  # an fsm.apply_acks task per batch, an fsm.enter_state task per state
    INLINE = "inline"  # the ack bridge applies acks and sends the next state_tasks itself


class Approver(BaseModel):
    """A person who decides at approval gates: their groups, and how they are known."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    groups: tuple[Annotated[str, Field(min_length=1, max_length=50)], ...] = Field(
        min_length=1, max_length=20
    )
    token: str | None = Field(default=None, max_length=500)  # their bearer token
    github: str | None = Field(default=None, max_length=39, pattern=r"^[A-Za-z0-9-]+$")
    # the GitHub account's numeric id: a login can be changed, and then taken by anyone
    github_id: int | None = Field(default=None, ge=1, le=2**53)

    @model_validator(mode="after")
    def _github_id(self) -> Approver:
        if self.github is not None and self.github_id is None:
            raise ValueError(
                f"github {self.github!r} needs github_id, the account's numeric id "
                f"(https://api.github.com/users/{self.github}): comments are matched by it, "
                "since a login can be renamed and then registered by someone else"
            )
        return self


class Settings(AgentSettings, ObservabilitySettings):
    """Everything a process of fsm-celery needs to know about its surroundings.

    Each setting is declared once: its type, its default and bounds, and below it the docstring
    that is its description (fsm_celery.settings_reference: README's table). The agents' own
    (the LLM agent's, the MCP servers of tool states) are fsm_celery.config_agents's; the
    metrics' are fsm_celery.config_observability's."""

    model_config = SettingsConfigDict(env_prefix="FSM_", frozen=True)

    database_url: urls.DatabaseUrl = "postgresql+psycopg2://postgres@127.0.0.1:5432/fsm_celery"
    """The database: postgresql:// (or postgres://, postgresql+psycopg2://), or sqlite:///PATH for
    the embedded mode."""
    database_prepare: bool = True
    """Run the hot statements as prepared statements of the database session; false behind a pooler
    that gives each transaction another session (PgBouncer's pool_mode = transaction)."""
    redis_url: urls.RedisUrl = "redis://127.0.0.1:6379/0"
    """Redis, for the agents' tasks and acks (redis://, rediss:// for TLS, unix://), or a primary
    behind Sentinel: redis+sentinel://[:PASSWORD@]HOST:PORT,HOST:PORT/MASTER[/DB]
    (docs/scaling.md)."""
    redis_replicas: int = Field(default=0, ge=0, le=16)
    """Replicas a state_task and an ack must reach (Redis WAIT) before they count as sent: 1 behind
    Sentinel, so that a failover loses neither; 0 waits for none."""
    redis_replica_timeout_ms: int = Field(default=500, ge=1, le=60_000)
    """How long a write waits for FSM_REDIS_REPLICAS before it is sent again."""
    broker_url: urls.BrokerUrl | None = None
    """Celery's broker, when it is not FSM_REDIS_URL: another Redis (redis://, behind Sentinel
    too), or RabbitMQ (amqp://USER:PASSWORD@HOST:5672/VHOST, amqps:// for TLS), whose queues are
    then quorum queues with publisher confirms; the agents keep FSM_REDIS_URL (docs/scaling.md)."""
    channel_prefix: str = ""
    """Prefixes every Redis key and channel (deployments sharing one)."""
    queue: str = "fsm"
    """The Celery queue of the fsm tasks."""
    queues: dict[str, str] = Field(default_factory=dict)
    """Celery queues per workload, as JSON: a machine type's tasks (entering its states, applying
    its acks) on a queue of its own (`{"research_pipeline": "fsm.research"}`); a child of a fan-out
    follows its root type unless named; the rest on FSM_QUEUE."""
    definitions_path: str | None = None
    """The definitions folder (or file); unset, the ones shipped in the package."""
    state_dir: str | None = None
    """Where this deployment's processes keep their local state (beat's celerybeat-schedule, the
    records `fsm-celery stop` reads); unset, a folder of the deployment's own in
    $XDG_STATE_HOME/fsm-celery, else ~/.local/state/fsm-celery."""
    task_token_secret: str = DEFAULT_SECRET
    """Signs the task tokens agents echo in their acks; comma-separated, the first signs and all are
    accepted (rotate by prepending). At least 32 bytes."""
    accept_unsigned_acks: bool = False
    """Accept acks without a valid task token (development only)."""
    accept_shared_acks: bool = True
    """Read the seed's shared ack channel and stream, which carry no identity (anyone who can write
    to Redis can answer there); off, only per-agent ack streams."""
    task_streams: bool = True
    """Also XADD each state_task to the agent's stream (durable), besides PUBLISH."""
    transition_mode: TransitionMode = TransitionMode.CELERY
    """celery: each batch of acks is an fsm.apply_acks task, each state entered an fsm.enter_state
    task (Flower shows every step); inline: the bridge applies acks and sends the next state_tasks
    itself (fewer hops, lower latency)."""
    dispatch_grace_seconds: float = Field(default=5.0, ge=0)
    """How long a state entry handed to an fsm.enter_state task is left to it before the scan enters
    the state itself."""
    max_relay_bytes: int = Field(default=4_194_304, gt=0)
    """The most bytes of agent messages one fsm.apply_acks task carries."""
    relay_linger_ms: float = Field(default=5.0, ge=0, le=1000)
    """In the celery mode, how long a short batch of acks may gather before the bridge hands it to a
    task (added to a transition's latency at most)."""
    stream_claim_idle_seconds: float = Field(default=30.0, gt=0)
    """After how long a bridge takes over the ack stream entries another left pending (it died)."""
    relay_timeout_seconds: float = Field(default=10.0, gt=0, le=3600)
    """In the celery mode, how long an ack relayed to a worker may go unapplied before a bridge
    relays it again (a task the broker lost costs this, not its state's deadline); each time
    twice as long, up to ten minutes. A copy applied already is refused as stale."""
    agent_liveness_seconds: float = Field(default=15.0, gt=0)
    """An agent that has not reported for this long gets no new machines."""
    visibility_timeout_seconds: int = Field(default=60, ge=5)
    """How long Redis waits before redelivering an unacknowledged Celery task (a Redis broker's
    only: RabbitMQ redelivers as soon as the worker's connection is gone)."""
    max_payload_bytes: int = Field(default=1_048_576, gt=0)
    """The largest agent message accepted."""
    ack_batch_size: int = Field(default=500, gt=0)
    """The most agent messages a bridge reads and applies at once."""
    worker_rounds_at_once: int = Field(default=1, ge=1, le=64)
    """In the celery mode, how many transactions of its tasks one worker process runs at once
    (a group commit: tasks that queue while they run wait, and the next one takes them all). With
    2, a task that arrives while one runs, and finds no other waiting, starts its own: lower
    latency at part load for a little of the maximum (docs/performance-history.md)."""
    scan_interval_seconds: float = Field(default=1.0, gt=0)
    """How often beat sends the scan (timeouts, due retries, repairs)."""
    schedule_interval_seconds: float = Field(default=1.0, gt=0)
    """How often beat looks for due schedule ticks (a tick is late by at most this)."""
    stats_interval_seconds: float = Field(default=5.0, gt=0)
    """How often beat folds new history rows into the statistics' counters."""
    max_context_bytes: int = Field(default=524_288, gt=0)
    """The largest machine context stored."""
    max_prompt_bytes: int = Field(default=131_072, gt=0)
    """The largest rendered prompt sent to an agent."""
    max_attempt_seconds: float = Field(default=86_400.0, gt=0)
    """The longest an attempt may run, whatever its heartbeats and deadlines."""
    max_fanout_items: int = Field(default=10_000, ge=1, le=1_000_000)
    """The most children one map state may start (more is refused, not cut)."""
    max_fanout_bytes: int = Field(default=67_108_864, ge=1, le=2**40)
    """The most bytes one fan-out's children's starting contexts may take together (more fails its
    state, before anything is written)."""
    agent_type_limits: dict[str, int] = Field(default_factory=dict)
    """Work in flight per agent type across all machines, as JSON (`{"researcher": 20}`); over
    definitions' agent_types."""
    max_child_depth: int = Field(default=5, ge=1, le=50)
    """How deep children may nest under a machine (checked on load and on start)."""
    max_handbacks: int = Field(default=3, ge=0)
    """Hand-backs in a row re-dispatched free; the next counts as a failure."""
    max_corrections: int = Field(default=2, ge=0, le=100)
    """Answers breaking their state's contract an attempt may correct (a state's
    `max_corrections` overrides it); the next is the attempt's failure (invalid_output)."""
    dead_letter_after: int = Field(default=3, ge=1)
    """Tries before a message that can be neither applied nor recorded is parked in the dead-letter
    stream (counted by its transport: a stream entry's deliveries, an fsm.apply_acks task's
    runs)."""
    ack_stream_maxlen: int = Field(default=100_000, ge=100)
    """The longest an ack stream may grow (trimmed)."""
    rejected_retention_days: float = Field(default=7.0, gt=0)
    """How long rejected messages are kept."""
    history_retention_days: float = Field(default=0.0, ge=0, le=36_500)
    """On PostgreSQL, how long a month of history (its machines' creation month) is kept after it
    ends: then, once all its machines ended and none changed for as long, beat's hourly job archives
    it (FSM_HISTORY_ARCHIVE) and removes it; 0 keeps it forever."""
    history_archive: str = ""
    """Where a month of history goes before it is removed: a directory (an absolute path: one
    gzipped CSV file per month, written by the worker that runs beat's job), `table` (detached and
    kept in the fsm_archive schema), or unset (dropped)."""
    agent_retention_days: float = Field(default=7.0, gt=0)
    """How long an agent that stopped reporting is listed."""
    admin_token: str = ""
    """Bearer tokens of the HTTP API's and dashboard's admins (read and act), comma-separated
    (rotate by prepending), each at least 32 bytes; unset, nobody acts."""
    viewer_token: str = ""
    """Bearer tokens of viewers (read only), comma-separated, each at least 32 bytes."""
    approvers: dict[str, Approver] = Field(default_factory=dict, max_length=1000)
    """The people who decide at approval gates, as JSON: {name: {"groups": [...], "token": their API
    and dashboard token (32+ bytes), "github": their GitHub login, "github_id": that account's
    numeric id (what /approve comments are matched by)}}. A definition's approval names groups,
    whose members vote; an admin may override any gate (decide it outright, recorded as an
    override)."""
    event_secrets: dict[str, str] = Field(default_factory=dict, max_length=200)
    """Per machine type, the secret (32+ bytes) that signs outside events sent to its machines over
    HTTP (X-FSM-Signature-256: sha256=HMAC of the timestamp, method, path and body: docs/events.md),
    as JSON {type: secret}; an admin's token may send any."""
    event_signature_window_seconds: int = Field(default=300, ge=1, le=3600)
    """How far a signed event's X-FSM-Timestamp may be from the server's clock; further, it is
    refused (a captured request cannot be replayed later)."""
    max_kept_events: int = Field(default=10, ge=1, le=1000)
    """Events of one name kept for a machine not yet waiting for them; more are refused."""
    dashboard_url: str = Field(default="", max_length=500)
    """The dashboard's address as people reach it (https://fsm.example.com): notifications of
    approvals waiting link to their decision page under it."""
    public_reads: bool = False
    """Serve the dashboard's pages and the API's reads without a token (acting still needs an
    admin's)."""
    session_secret: str = ""
    """Signs the dashboard's session cookies (at least 32 bytes); unset, derived from
    FSM_TASK_TOKEN_SECRET."""
    secure_cookies: bool = True
    """Send the dashboard's session cookie over HTTPS only (Chromium keeps it at http://127.0.0.1
    and localhost too). false: a browser asking for 127.0.0.1, [::1] or localhost over plain HTTP
    gets it without Secure (a dashboard on loopback without TLS, for browsers that keep no Secure
    cookie there); any other host still gets it HTTPS-only."""
    max_request_bytes: int = Field(default=1_048_576, gt=0)
    """The largest HTTP request body accepted."""
    notify_url: urls.HttpUrlOrUnset = ""
    """Where every machine that ends is POSTed (besides its definition's notify url); unset, only
    definitions that say so notify."""
    notify_secret: str = ""
    """Signs notifications (X-FSM-Signature-256: HMAC-SHA256 of the body); 32+ bytes, needed as soon
    as any notification is to be sent."""
    notify_max_attempts: int = Field(default=8, ge=1, le=100)
    """Tries of a notification before it is failed."""
    notify_timeout_seconds: float = Field(default=5.0, gt=0, le=60)
    """How long a notification's receiver may take."""
    github_webhook_secret: str = ""
    """The secret of the GitHub webhook (POST /webhooks/github checks X-Hub-Signature-256 with it);
    unset, the webhook answers 503 and starts nothing."""
    github_build_type: str = "cto_build_project"
    """The machine type an issue assigned on GitHub starts."""
    github_bug_type: str = "cto_fix_bug"
    """The machine type an issue opened with the bug label starts."""
    github_bug_label: str = "bug"
    """The label that makes an opened issue a bug."""
    github_fork_heads: bool = False
    """Let a check suite or workflow run whose head is in another repository (a fork's pull request)
    be checks_completed for the machines of the repository it ran in; by default only runs of the
    repository's own branches are."""

    @field_validator("queues")
    @classmethod
    def _queues(cls, value: dict[str, str]) -> dict[str, str]:
        for machine_type, queue in value.items():
            if not MACHINE_TYPE.fullmatch(machine_type):
                raise ValueError(f"{machine_type!r} is not a machine type (letters, digits, _ .)")
            if not QUEUE_NAME.fullmatch(queue):
                raise ValueError(
                    f"{machine_type}: {queue!r} is not a queue name (1 to 100 of letters, "
                    "digits and . _ - :)"
                )
        return value

    @field_validator("broker_url", mode="before")
    @classmethod
    def _broker_url(cls, value: object) -> object:
        """Empty is unset (compose passes `${FSM_BROKER_URL:-}` to every service)."""
        return None if value == "" else value

    @field_validator("history_archive")
    @classmethod
    def _history_archive(cls, value: str) -> str:
        if value not in ("", ARCHIVE_TABLE) and not value.startswith("/"):
            raise ValueError(f"{value!r} is neither `table` nor an absolute directory path")
        return value

    @field_validator("agent_type_limits")
    @classmethod
    def _agent_type_limits(cls, value: dict[str, int]) -> dict[str, int]:
        for agent_type, bound in value.items():
            if not 1 <= len(agent_type) <= 10:
                raise ValueError(f"agent type {agent_type!r} must be 1 to 10 characters")
            if not 1 <= bound <= 1_000_000:
                raise ValueError(f"{agent_type}: max in flight must be 1 to 1000000, got {bound}")
        return value

    @property
    def definitions(self) -> Path:
        """The definitions folder (or file): FSM_DEFINITIONS_PATH, else the shipped ones."""
        from fsm_celery.core.loader import SHIPPED_DEFINITIONS

        return Path(self.definitions_path) if self.definitions_path else SHIPPED_DEFINITIONS

    @property
    def state_directory(self) -> Path:
        """FSM_STATE_DIR, else this deployment's folder in the user's state directory (XDG's
        convention): deployments of one OS user never share a beat schedule or records."""
        if self.state_dir:
            return Path(self.state_dir).expanduser()
        xdg = os.environ.get("XDG_STATE_HOME", "")
        base = Path(xdg) if Path(xdg).is_absolute() else Path.home() / ".local" / "state"
        return base / "fsm-celery" / self.deployment

    @property
    def deployment(self) -> str:
        """A name of this deployment: its database's, and a digest of where it keeps its
        state and tasks (the URLs masked: no password is digested where others may read)."""
        where = (
            urls.mask(self.database_url),
            urls.mask(self.redis_url),
            self.channel_prefix,
            self.queue,
        )
        digest = hashlib.sha256("\n".join(where).encode()).hexdigest()[:12]
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", urlsplit(self.database_url).path.strip("/"))
        return f"{name or 'fsm'}-{digest}"

    @property
    def housekeeping_queue(self) -> str:
        """The queue of the engine's periodic work (scan, schedules, notifications, ...),
        which every worker consumes besides FSM_QUEUE."""
        return f"{self.queue}.housekeeping"

    def queue_for(self, machine_type: str) -> str:
        """The Celery queue of a machine type's tasks: FSM_QUEUES's for it (a child's own, else
        its root type's), else FSM_QUEUE."""
        found = self.queues.get(machine_type)
        if found is None:
            found = self.queues.get(machine_type.split(".", 1)[0], self.queue)
        return found

    @property
    def work_queues(self) -> list[str]:
        """The queues of the machines' tasks: FSM_QUEUE, then FSM_QUEUES's (not housekeeping)."""
        return [self.queue, *sorted(set(self.queues.values()) - {self.queue})]

    @property
    def celery_broker_url(self) -> str:
        """Celery's broker: FSM_BROKER_URL, else FSM_REDIS_URL (behind Sentinel, as kombu
        spells it: celery_transport_options name the master)."""
        url = self.broker_url or self.redis_url
        if is_sentinel(url):
            return kombu_url(parse_sentinel(url))
        return url

    @property
    def broker_is_amqp(self) -> bool:
        """Whether Celery's broker is RabbitMQ (FSM_BROKER_URL amqp://)."""
        return self.broker_url is not None and urls.is_amqp(self.broker_url)

    @property
    def celery_transport_options(self) -> dict[str, Any]:
        """Celery's broker_transport_options: on RabbitMQ, publisher confirms (a task counts as
        sent once the quorum queue's majority has it); on Redis the visibility timeout, and
        behind Sentinel the master's name and the sentinels' login."""
        if self.broker_is_amqp:
            return {"confirm_publish": True}
        options: dict[str, Any] = {"visibility_timeout": self.visibility_timeout_seconds}
        url = self.broker_url or self.redis_url
        if is_sentinel(url):
            options.update(kombu_options(parse_sentinel(url)))
        return options

    @cached_property
    def token_secrets(self) -> tuple[str, ...]:
        """The accepted task token secrets; the first signs (read on every ack and dispatch:
        split once)."""
        return tuple(s.strip() for s in self.task_token_secret.split(",") if s.strip()) or ("",)

    def secret_problem(self) -> str | None:
        """Why the task token secrets (or the notifications' secret) are unfit for a
        deployment, or None."""
        for secret in self.token_secrets:
            if secret == DEFAULT_SECRET:
                return "FSM_TASK_TOKEN_SECRET is the default"
            problem = weak_secret(secret, MIN_SECRET_BYTES)
            if problem is not None:
                return f"FSM_TASK_TOKEN_SECRET {problem}"
        return _optional_secret_problem("FSM_NOTIFY_SECRET", self.notify_secret, MIN_SECRET_BYTES)

    def require_secret(self) -> None:
        """Refuse to run a long-lived process with a guessable task token secret."""
        problem = self.secret_problem()
        if problem is not None:
            raise InsecureSecret(problem)

    @property
    def admin_tokens(self) -> tuple[str, ...]:
        return _listed(self.admin_token)

    @cached_property
    def approver_groups(self) -> dict[str, frozenset[str]]:
        """Each approver group's members, by name."""
        groups: dict[str, set[str]] = {}
        for name, approver in self.approvers.items():
            for group in approver.groups:
                groups.setdefault(group, set()).add(name)
        return {group: frozenset(names) for group, names in groups.items()}

    @property
    def viewer_tokens(self) -> tuple[str, ...]:
        return _listed(self.viewer_token)

    def dashboard_problem(self) -> str | None:
        """Why the HTTP API and dashboard cannot be served with these settings, or None."""
        approver_tokens = tuple(a.token for a in self.approvers.values() if a.token)
        for machine_type, secret in self.event_secrets.items():
            problem = weak_secret(secret, MIN_SECRET_BYTES)
            if problem is not None:
                return f"FSM_EVENT_SECRETS holds a secret for {machine_type} that {problem}"
        for name, tokens in (
            ("FSM_ADMIN_TOKEN", self.admin_tokens),
            ("FSM_VIEWER_TOKEN", self.viewer_tokens),
            ("FSM_APPROVERS", approver_tokens),
        ):
            for token in tokens:
                problem = weak_secret(token, MIN_SECRET_BYTES)
                if problem is not None:
                    return f"{name} holds a token that {problem}"
        # GitHub's webhook secret is whatever was typed on GitHub: no length is asked of it.
        for name, value, min_bytes in (
            ("FSM_SESSION_SECRET", self.session_secret, MIN_SECRET_BYTES),
            ("FSM_GITHUB_WEBHOOK_SECRET", self.github_webhook_secret, 0),
        ):
            problem = _optional_secret_problem(name, value, min_bytes)
            if problem is not None:
                return problem
        if not (self.admin_tokens or self.viewer_tokens or self.public_reads):
            return "neither FSM_ADMIN_TOKEN nor FSM_VIEWER_TOKEN is set (and reads are not public)"
        return None


def _optional_secret_problem(name: str, value: str, min_bytes: int = 0) -> str | None:
    """An optional secret (unset is allowed) that is set must not be guessable."""
    problem = weak_secret(value, min_bytes) if value else None
    return None if problem is None else f"{name} {problem}"


def _listed(value: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in value.split(",") if t.strip())


MACHINE_TYPE = re.compile(r"[A-Za-z][A-Za-z0-9_]*(\.[A-Za-z][A-Za-z0-9_]*)*")
QUEUE_NAME = re.compile(r"[A-Za-z0-9._:-]{1,100}")
ARCHIVE_TABLE = "table"  # FSM_HISTORY_ARCHIVE: detach the months and keep them as tables


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The settings of this process, read once from the environment."""
    return Settings()
