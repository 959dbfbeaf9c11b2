"""The settings of what works states besides agents of one's own: the LLM agent (`fsm-celery
agent --llm`) and the MCP servers tool states call. A part of fsm_celery.config.Settings (its
base), declared here as there: each setting's docstring is its description."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class LlmPrice(BaseModel):
    """What a model's tokens cost, in the currency budgets are kept in, per million tokens."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: float = Field(ge=0, le=1_000_000)
    output: float = Field(ge=0, le=1_000_000)


class McpServer(BaseModel):
    """An MCP server that tool states call (FSM_MCP_SERVERS): a command a worker process starts
    once and talks to over stdio, or a URL it reaches over streamable HTTP."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    command: list[Annotated[str, Field(min_length=1, max_length=4096)]] | None = Field(
        default=None, min_length=1, max_length=100
    )
    env: dict[str, str] = Field(default_factory=dict, max_length=100)
    cwd: str | None = Field(default=None, max_length=4096)
    url: str | None = Field(default=None, max_length=2000, pattern=r"^https?://")
    headers: dict[str, str] = Field(default_factory=dict, max_length=50)

    @model_validator(mode="after")
    def _one_transport(self) -> McpServer:
        if (self.command is None) == (self.url is None):
            raise ValueError("give a command (stdio) or a url (streamable HTTP), one of them")
        if self.url is not None and (self.env or self.cwd):
            raise ValueError("env and cwd are a command's: a url takes headers")
        if self.command is not None and self.headers:
            raise ValueError("headers are a url's: a command takes env and cwd")
        return self


class AgentSettings(BaseSettings):
    """The agents' part of the settings (FSM_LLM_*, FSM_MCP_SERVERS, FSM_TOOL_QUEUE)."""

    model_config = SettingsConfigDict(env_prefix="FSM_", frozen=True)

    llm_base_url: str | None = None
    """The OpenAI-compatible endpoint `fsm-celery agent --llm` asks (https://host/v1)."""
    llm_api_key: str = ""
    """The key the LLM agent sends to that endpoint (a local server may take none)."""
    llm_model: str | None = Field(default=None, max_length=200)
    """The model the LLM agent asks, unless FSM_LLM_MODELS names one for the state or type."""
    llm_models: dict[str, str] = Field(default_factory=dict, max_length=1000)
    """The model per state (`machine_type.STATE`) or per agent type, as JSON {key: model}."""
    llm_prices: dict[str, LlmPrice] = Field(default_factory=dict, max_length=1000)
    """Per model, what a million tokens cost, as JSON {model: {"input": x, "output": y}}: the
    cost the LLM agent reports for each state (against the machine's budget); unpriced, 0."""
    llm_max_corrections: int = Field(default=2, ge=0, le=10)
    """How many times the LLM agent sends a model's answer back to be corrected (not JSON, or
    breaking the state's output contract) before it answers the attempt as failed."""
    llm_max_retries: int = Field(default=5, ge=0, le=50)
    """How many times the LLM agent asks again after a 429 or 5xx (after the server's
    Retry-After, else a growing delay), never past the state's deadline."""
    mcp_servers: dict[
        Annotated[str, Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")], McpServer
    ] = Field(default_factory=dict, max_length=100)
    """The MCP servers tool states call, as JSON {name: {"command": [...], "env": {...}}} or
    {name: {"url": "https://host/mcp", "headers": {...}}}: a command each worker process starts
    once and talks to over stdio, or a server it reaches over streamable HTTP."""
    tool_queue: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._:-]{1,100}$")
    """The Celery queue of fsm.call_tool tasks (the calls of tool states, which wait on their
    tool): unset, the machine type's queue (FSM_QUEUES, else FSM_QUEUE)."""
