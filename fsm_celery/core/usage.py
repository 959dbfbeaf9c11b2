"""Usage accounting and budgets: what agents report spending, and when a machine must stop. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from fsm_celery.core.messages import INT64_MAX

BUDGET_EXCEEDED = "budget exceeded"

# The most a machine may have spent, bounds that an ack's report cannot pass (it is rejected as
# invalid_value, auditable, instead of being summed into a total the database refuses after the
# batch's next states were sent). Tokens: 2**53 - 1, the largest whole number every JSON reader
# (the dashboard's JavaScript too) reads exactly, so that sums over many machines stay far inside
# BIGINT. Cost: a trillion in the agents' currency, kept to a ten-thousandth as a float; no agent
# bills near it, and sums over millions of machines stay finite.
MAX_TOKENS = 2**53 - 1
MAX_COST = 1e12


@dataclass(frozen=True)
class Usage:
    """Tokens and cost spent (cost in the currency the agents report, e.g. USD)."""

    tokens: int = 0
    cost: float = 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.tokens + other.tokens, round(self.cost + other.cost, 6))

    def rolled(self, spent: Usage) -> Usage:
        """These totals with a descendant's spending added, saturating at the bounds of a
        machine's own totals: 1,025 children each at the bound would pass BIGINT, and their
        parent's totals count what they spent, not what a row can add up."""
        tokens = min(self.tokens + spent.tokens, max(self.tokens, MAX_TOKENS))
        cost = min(round(self.cost + spent.cost, 6), max(self.cost, MAX_COST))
        return Usage(tokens, cost)

    def past_bounds(self) -> str | None:
        """Why these totals are more than a machine may have spent, or None."""
        if self.tokens > MAX_TOKENS:
            return f"{self.tokens} tokens, over the most a machine may spend ({MAX_TOKENS})"
        if not self.cost <= MAX_COST:  # inf and nan too
            return f"cost {self.cost:g}, over the most a machine may spend ({MAX_COST:g})"
        return None


def unbounded(spent: Usage, reported: Usage) -> str | None:
    """Why an ack's reported usage cannot be added to what its machine spent, or None.

    Only what is added is checked: a total stored past the bounds before they existed does not
    stop the acks that report nothing."""
    if reported.tokens == 0 and reported.cost == 0:
        return None
    total = spent + reported
    problem = total.past_bounds()
    if problem is None:
        return None
    what = f"tokensUsed {reported.tokens}, cost {reported.cost:g}"
    return f"{what} would take the machine's totals to {problem}"


class Budget(BaseModel):
    """The most a machine may spend; None means no limit."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # within the columns that store them (BIGINT, a finite double)
    tokens: int | None = Field(default=None, ge=0, le=INT64_MAX)
    cost: float | None = Field(default=None, ge=0, allow_inf_nan=False)

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
    return Usage(tokens if valid_tokens else 0, _float(cost) if valid_cost else 0.0)


def _float(value: float) -> float:
    try:
        return float(value)
    except OverflowError:  # a whole number past a double's range: as good as infinite
        return float("inf")
