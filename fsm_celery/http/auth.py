"""Who is asking: a bearer token (the API's clients), a signed session cookie (the dashboard's
pages, after signing in with a token), or nobody (reads, when FSM_PUBLIC_READS allows them).

Two roles: viewers read, admins read and act. Tokens are compared in constant time; a session
remembers a fingerprint of the token it was opened with, so that removing a token from the
settings closes its sessions too. A request that acts through a session must carry the
session's CSRF token in X-CSRF-Token (the cookie is SameSite=strict as well).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from enum import IntEnum
from typing import Annotated

from fastapi import Depends, HTTPException, Request

from fsm_celery.config import Settings

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
CSRF_HEADER = "x-csrf-token"


class Role(IntEnum):
    VIEWER = 1
    ADMIN = 2


@dataclass(frozen=True)
class Principal:
    """Who a request comes from: role None is an anonymous reader (public reads)."""

    role: Role | None
    name: str  # recorded as the actor of what an admin does, unless the request names one
    via: str  # "token", "session" or "public"

    @property
    def is_admin(self) -> bool:
        return self.role is Role.ADMIN


class Auth:
    """The tokens of the settings, and the keys derived for sessions."""

    def __init__(self, settings: Settings) -> None:
        self._tokens = [(t, Role.ADMIN) for t in settings.admin_tokens] + [
            (t, Role.VIEWER) for t in settings.viewer_tokens
        ]
        self.public_reads = settings.public_reads
        self.session_key = (
            settings.session_secret
            or hmac.new(
                settings.token_secrets[0].encode(), b"fsm-celery dashboard sessions", hashlib.sha256
            ).hexdigest()
        )

    def role_of(self, token: str) -> Role | None:
        """The role of the token, or None; every configured token is compared, in constant
        time, so the answer's timing says nothing about which one nearly matched."""
        given = token.encode()
        found: Role | None = None
        for known, role in self._tokens:
            if hmac.compare_digest(known.encode(), given) and found is None:
                found = role
        return found

    def fingerprint(self, token: str) -> str:
        return hmac.new(self.session_key.encode(), token.encode(), hashlib.sha256).hexdigest()

    def session_role(self, fingerprint: str) -> Role | None:
        """The role of the token a session was opened with, if that token is still valid."""
        found: Role | None = None
        for known, role in self._tokens:
            if hmac.compare_digest(self.fingerprint(known), fingerprint) and found is None:
                found = role
        return found

    def open_session(self, request: Request, token: str, name: str) -> Role | None:
        """Sign the session in with the token; its role, or None (the session is cleared)."""
        request.session.clear()
        role = self.role_of(token)
        if role is None:
            return None
        request.session.update(
            key=self.fingerprint(token), name=name, csrf=secrets.token_urlsafe(24)
        )
        return role


def csrf_token(request: Request) -> str:
    """The session's CSRF token (made on first use, also before signing in)."""
    token = request.session.get("csrf")
    if not isinstance(token, str):
        token = request.session["csrf"] = secrets.token_urlsafe(24)
    return token


def unauthorized(message: str) -> HTTPException:
    return HTTPException(401, message, headers={"WWW-Authenticate": "Bearer"})


def principal(request: Request) -> Principal:
    """Who sent the request (401 for a bad token or a session whose token was revoked)."""
    auth: Auth = request.app.state.auth
    header = request.headers.get("authorization")
    if header is not None:
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise unauthorized("the Authorization header must be: Bearer <token>")
        role = auth.role_of(token.strip())
        if role is None:
            raise unauthorized("invalid token")
        return Principal(role, role.name.lower(), "token")
    key = request.session.get("key")
    if isinstance(key, str):
        role = auth.session_role(key)
        if role is None:
            request.session.clear()
            raise unauthorized("the session's token is no longer valid: sign in again")
        if request.method not in SAFE_METHODS:
            given = request.headers.get(CSRF_HEADER, "")
            if not hmac.compare_digest(given.encode(), csrf_token(request).encode()):
                raise HTTPException(403, "missing or wrong X-CSRF-Token for this session")
        return Principal(role, str(request.session.get("name") or role.name.lower()), "session")
    return Principal(None, "anonymous", "public")


def viewer(request: Request, who: Annotated[Principal, Depends(principal)]) -> Principal:
    """A reader: any role, or anyone when reads are public."""
    if who.role is None and not request.app.state.auth.public_reads:
        raise unauthorized("a viewer's or admin's token is needed (Authorization: Bearer …)")
    return who


def admin(who: Annotated[Principal, Depends(principal)]) -> Principal:
    """An admin, and nobody else."""
    if who.role is None:
        raise unauthorized("an admin's token is needed (Authorization: Bearer …)")
    if not who.is_admin:
        raise HTTPException(403, "this needs an admin's token; yours is a viewer's")
    return who
