"""Who is asking: a bearer token (the API's clients), a signed session cookie (the dashboard's
pages, after signing in with a token), or nobody (reads, when FSM_PUBLIC_READS allows them).

Two roles: viewers read, admins read and act. Tokens are compared in constant time; a session
remembers a fingerprint of the token it was opened with, so that removing a token from the
settings closes its sessions too. A request that acts through a session must carry the
session's CSRF token in X-CSRF-Token (the cookie is SameSite=strict as well).

A signed cookie alone cannot be taken back: a copy saved before signing out would act until it
expires. So each session has a random id, live in Redis (under its hash) from sign-in until
sign-out or SESSION_SECONDS, and checked on every request. Ids rather than a generation per
token: signing out ends that browser's session only, not those of everyone sharing the token;
the keys expire with their sessions, and every dashboard process sees the same ones.

The cookie is Secure (sent over HTTPS only), except, when FSM_SECURE_COOKIES=false says so,
to a browser asking for a loopback host over plain HTTP (a cookie scoped to 127.0.0.1 or
localhost never crosses a network).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from dataclasses import dataclass
from typing import Annotated
from urllib.parse import urlsplit

import redis
from fastapi import Depends, HTTPException, Request
from starlette.datastructures import Headers
from starlette.middleware.sessions import SessionMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from fsm_celery.client.identities import Identities, Known, Role
from fsm_celery.config import Settings

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
CSRF_HEADER = "x-csrf-token"
SESSION_COOKIE = "fsm_session"
SESSION_SECONDS = 12 * 3600
SESSION_KEY = "dashboard:session:{digest}"


@dataclass(frozen=True)
class Principal:
    """Who a request comes from: role None is an anonymous reader (public reads)."""

    role: Role | None
    name: str  # recorded as the actor of what an admin does, unless the request names one
    via: str  # "token", "session" or "public"
    groups: frozenset[str] = frozenset()  # an approver's (FSM_APPROVERS): gates they decide

    @property
    def is_admin(self) -> bool:
        return self.role is Role.ADMIN

    @property
    def is_approver(self) -> bool:
        return bool(self.groups)


class Sessions:
    """The ids of the sessions signed in and not yet out, in Redis, each expiring with its
    session (only a hash of the id is stored: reading Redis gives no cookie's id away)."""

    def __init__(self, client: redis.Redis, prefix: str, seconds: int = SESSION_SECONDS) -> None:
        self._redis = client
        self._prefix = prefix
        self.seconds = seconds

    def _key(self, session_id: str) -> str:
        digest = hashlib.sha256(session_id.encode()).hexdigest()
        return self._prefix + SESSION_KEY.format(digest=digest)

    def open(self) -> str:
        """A new session's id, live for `seconds` from now."""
        session_id = secrets.token_urlsafe(32)
        self._redis.set(self._key(session_id), b"1", ex=self.seconds)
        return session_id

    def alive(self, session_id: str) -> bool:
        return bool(self._redis.exists(self._key(session_id)))

    def end(self, session_id: str) -> None:
        self._redis.delete(self._key(session_id))


class Auth:
    """The tokens of the settings, the keys derived for sessions, and the live sessions."""

    def __init__(self, settings: Settings, sessions: Sessions) -> None:
        self.identities = Identities(settings)
        self._known = self.identities.known
        self.public_reads = settings.public_reads
        self.sessions = sessions
        self.session_key = (
            settings.session_secret
            or hmac.new(
                settings.token_secrets[0].encode(), b"fsm-celery dashboard sessions", hashlib.sha256
            ).hexdigest()
        )

    def identify(self, token: str) -> Known | None:
        """The settings' token it is, or None (client/identities.py)."""
        return self.identities.identify(token)

    def role_of(self, token: str) -> Role | None:
        known = self.identify(token)
        return None if known is None else known.role

    def fingerprint(self, token: str) -> str:
        return hmac.new(self.session_key.encode(), token.encode(), hashlib.sha256).hexdigest()

    def session_identity(self, fingerprint: str) -> Known | None:
        """The token a session was opened with, if that token is still valid."""
        found: Known | None = None
        for known in self._known:
            if hmac.compare_digest(self.fingerprint(known.token), fingerprint) and found is None:
                found = known
        return found

    def open_session(self, request: Request, token: str, name: str) -> Role | None:
        """Sign the session in with the token; its role, or None (the session is cleared).
        An approver's session bears their own name, whatever name was typed."""
        self.close_session(request)
        known = self.identify(token)
        if known is None:
            return None
        role = known.role
        name = known.name or name
        request.session.update(
            key=self.fingerprint(token),
            sid=self.sessions.open(),
            name=name,
            csrf=secrets.token_urlsafe(24),
        )
        return role

    def close_session(self, request: Request) -> None:
        """Sign the session out: its id ends here, so no saved copy of the cookie acts again."""
        session_id = request.session.get("sid")
        if isinstance(session_id, str):
            self.sessions.end(session_id)
        request.session.clear()

    def session_alive(self, request: Request) -> bool:
        session_id = request.session.get("sid")
        return isinstance(session_id, str) and self.sessions.alive(session_id)


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
        known = auth.identify(token.strip())
        if known is None:
            raise unauthorized("invalid token")
        return Principal(known.role, known.name or known.role.name.lower(), "token", known.groups)
    key = request.session.get("key")
    if isinstance(key, str):
        found = auth.session_identity(key)
        if found is None:
            request.session.clear()
            raise unauthorized("the session's token is no longer valid: sign in again")
        if not auth.session_alive(request):
            request.session.clear()
            raise unauthorized("the session has ended (signed out or expired): sign in again")
        if request.method not in SAFE_METHODS:
            given = request.headers.get(CSRF_HEADER, "")
            if not hmac.compare_digest(given.encode(), csrf_token(request).encode()):
                raise HTTPException(403, "missing or wrong X-CSRF-Token for this session")
        role = found.role
        name = found.name or str(request.session.get("name") or role.name.lower())
        return Principal(role, name, "session", found.groups)
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


def decider(who: Annotated[Principal, Depends(principal)]) -> Principal:
    """An admin, or an approver (whose groups the gate's approvers must include)."""
    if who.role is None:
        raise unauthorized("an admin's or an approver's token is needed (Authorization: Bearer …)")
    if not (who.is_admin or who.is_approver):
        raise HTTPException(403, "deciding at a gate needs an admin's or an approver's token")
    return who


class SessionCookies:
    """The signed session cookie, Secure unless plain HTTP on loopback is allowed and asked for
    (Starlette's middleware fixes the flag for every request: one of each, chosen per request)."""

    def __init__(self, app: ASGIApp, secret_key: str, plain_on_loopback: bool) -> None:
        def middleware(https_only: bool) -> SessionMiddleware:
            return SessionMiddleware(
                app,
                secret_key=secret_key,
                session_cookie=SESSION_COOKIE,
                max_age=SESSION_SECONDS,
                same_site="strict",
                https_only=https_only,
            )

        self._secure = middleware(True)
        self._plain = middleware(False)
        self._plain_on_loopback = plain_on_loopback

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        plain = self._plain_on_loopback and plain_loopback(scope)
        await (self._plain if plain else self._secure)(scope, receive, send)


def plain_loopback(scope: Scope) -> bool:
    """Whether the request came over plain HTTP for a loopback host (127.0.0.0/8, ::1,
    localhost): the host the browser scopes the cookie to is the one it asked for."""
    if scope["type"] not in ("http", "websocket") or scope.get("scheme") not in ("http", "ws"):
        return False
    return loopback_host(Headers(scope=scope).get("host", ""))


def loopback_host(host: str) -> bool:
    """Whether a Host header names this machine's loopback interface."""
    try:
        name = urlsplit("//" + host).hostname
    except ValueError:
        return False
    if name is None:
        return False
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
