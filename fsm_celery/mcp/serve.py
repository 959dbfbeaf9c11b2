"""The operator door's transports. Over stdio, one identity for the whole session: the token
the command was given. Over streamable HTTP, each request's own: its `Authorization: Bearer`
token, one of the dashboard's; no token or a wrong one is a 401 before MCP sees the request.
Each identity has its own MCP server (its tools listed for it alone, operator.py), built at
start for every token of the settings; a session opened with one token is unknown to the
others."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from fsm_celery.client import Client
from fsm_celery.client.identities import Identities, Known
from fsm_celery.mcp.operator import operator_server

PATH = "/mcp"


def serve_stdio(client: Client, identity: Known) -> None:
    """Serve the identity's tools over stdin and stdout until the client closes them."""
    operator_server(client, identity).run("stdio")


def serve_http(client: Client, identities: Identities, host: str, port: int) -> None:
    """Serve every identity's tools over streamable HTTP at http://HOST:PORT/mcp."""
    import uvicorn

    uvicorn.run(BearerDoor(client, identities, host), host=host, port=port, log_level="info")


class BearerDoor:
    """The ASGI app in front of the identities' MCP apps: the bearer token picks one."""

    def __init__(self, client: Client, identities: Identities, host: str) -> None:
        self.identities = identities
        self.servers = {known: operator_server(client, known) for known in identities}
        self.apps: dict[Known, ASGIApp] = {
            known: server.streamable_http_app(streamable_http_path=PATH, host=host)
            for known, server in self.servers.items()
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        known, problem = self._identify(Headers(scope=scope).get("authorization"))
        if known is None:
            await unauthorized(send, problem)
            return
        await self.apps[known](scope, receive, send)

    def _identify(self, header: str | None) -> tuple[Known | None, str]:
        if header is None:
            return None, "a token is needed: Authorization: Bearer <token>"
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None, "the Authorization header must be: Bearer <token>"
        known = self.identities.identify(token.strip())
        return known, "" if known is not None else "invalid token"

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        """Run every identity's session manager for as long as the server runs."""
        await receive()  # lifespan.startup
        async with self._managers():
            await send({"type": "lifespan.startup.complete"})
            await receive()  # lifespan.shutdown
        await send({"type": "lifespan.shutdown.complete"})

    @contextlib.asynccontextmanager
    async def _managers(self) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            for server in self.servers.values():
                await stack.enter_async_context(server.session_manager.run())
            yield


async def unauthorized(send: Send, message: str) -> None:
    """A 401 naming what was wrong, asking for a bearer token."""
    body: Any = json.dumps({"detail": message}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"www-authenticate", b"Bearer"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
