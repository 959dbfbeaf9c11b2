"""Usage accounting and budgets: what agents report spending, and when a machine must stop. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

BUDGET_EXCEEDED = "budget exceeded"


@dataclass(frozen=True)
class Usage:
    """Tokens and cost spent (cost in the currency the agents report, e.g. USD)."""

    tokens: int = 0
    cost: float = 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.tokens + other.tokens, round(self.cost + other.cost, 6))


class Budget(BaseModel):
    """The most a machine may spend; None means no limit."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tokens: int | None = Field(default=None, ge=0)
    cost: float | None = Field(default=None, ge=0)

    def exceeded_by(self, usage: Usage) -> str | None:
        """Why the usage is over this budget, or None."""
        if self.tokens is not None and usage.tokens > self.tokens:
            return f"{BUDGET_EXCEEDED}: {usage.tokens} tokens used, budget {self.tokens}"
        if self.cost is not None and usage.cost > self.cost:
            return f"{BUDGET_EXCEEDED}: cost {usage.cost:g} spent, budget {self.cost:g}"
        return None


NO_BUDGET = Budget()
NOTHING = Usage()


def usage_of(output: Mapping[str, Any]) -> Usage:
    """The usage an ack's output reports in `tokensUsed` and `cost` (ignored when malformed)."""
    tokens = output.get("tokensUsed", 0)
    cost = output.get("cost", 0.0)
    valid_tokens = isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 0
    valid_cost = isinstance(cost, int | float) and not isinstance(cost, bool) and cost >= 0
    return Usage(tokens if valid_tokens else 0, float(cost) if valid_cost else 0.0)
