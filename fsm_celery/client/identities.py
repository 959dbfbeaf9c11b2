"""Who a token is: the settings' admin, viewer and approver tokens, each with its role, and an
approver's name and groups. The dashboard and the MCP door both resolve their callers here."""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum

from fsm_celery.config import Settings


class Role(IntEnum):
    VIEWER = 1
    ADMIN = 2


@dataclass(frozen=True)
class Known:
    """A token of the settings: its role, and for an approver's, their name and groups."""

    token: str
    role: Role
    name: str | None = None
    groups: frozenset[str] = frozenset()

    @property
    def actor(self) -> str:
        """The name what this identity does is recorded under: an approver's own, else the
        role's ("admin", "viewer")."""
        return self.name or self.role.name.lower()


class Identities:
    """Every token the settings name, compared in constant time."""

    def __init__(self, settings: Settings) -> None:
        self.known = (
            [Known(t, Role.ADMIN) for t in settings.admin_tokens]
            + [Known(t, Role.VIEWER) for t in settings.viewer_tokens]
            + [
                Known(a.token, Role.VIEWER, name, frozenset(a.groups))
                for name, a in settings.approvers.items()
                if a.token
            ]
        )

    def __iter__(self) -> Iterator[Known]:
        return iter(self.known)

    def identify(self, token: str) -> Known | None:
        """The settings' token it is, or None; every configured token is compared, in constant
        time, so the answer's timing says nothing about which one nearly matched."""
        given = token.encode()
        found: Known | None = None
        for known in self.known:
            if hmac.compare_digest(known.token.encode(), given) and found is None:
                found = known
        return found
