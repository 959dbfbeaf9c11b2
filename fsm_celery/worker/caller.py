"""The MCP client of tool states: a worker process's connections to the servers of
FSM_MCP_SERVERS, each opened on its first call and kept (a stdio server is started once per
process, not once per call), on an event loop of the caller's own thread, so that the worker's
threads each block on their own call only.

A call is bounded by its attempt's deadline; a server that fails (its process died, its HTTP
session is gone) is connected anew on the next call. Whatever goes wrong is the attempt's
failure, named (`failed`), never the worker's: the state's retries and failure edge decide.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, TextIO

import httpx2
import mcp_types as types
from mcp.client import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from fsm_celery.config import Settings
from fsm_celery.config_agents import McpServer
from fsm_celery.core import tool
from fsm_celery.core.contract import flaws, summary
from fsm_celery.engine.tools import Pending
from fsm_celery.traces import tool_call

log = logging.getLogger(__name__)

CONNECT_SECONDS = 30.0  # the longest a server may take to start and answer `initialize`
GRACE = 1.0  # waited past the deadline: by then the scan (every second) has timed it out


class Caller:
    """Makes tool calls for the worker's threads: `call` blocks until the tool answers, the
    attempt's deadline passes, or the server fails."""

    def __init__(self, settings: Settings) -> None:
        self._servers = settings.mcp_servers
        self._max_bytes = settings.max_payload_bytes
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._links: dict[str, _Link] = {}

    def call(self, pending: Pending) -> tool.Outcome | None:
        """What the pending call came to (its output, or its failure named); None when the
        attempt's deadline passed first: the scan times it out, as any other attempt (a
        timeout, which the state's retry_on tells from a failure)."""
        spec = self._servers.get(pending.call.server)
        if spec is None:
            known = ", ".join(sorted(self._servers)) or "none"
            return tool.failed(
                f"no MCP server {pending.call.server!r} in FSM_MCP_SERVERS (known: {known})"
            )
        remaining = (pending.deadline - datetime.now(UTC)).total_seconds()
        if remaining <= 0:
            return None
        loop = self._running_loop()
        with tool_call(pending.call.server, pending.call.name) as answered:  # traced: a span
            work = asyncio.run_coroutine_threadsafe(self._call(pending, spec, remaining), loop)
            try:
                found = work.result(remaining + GRACE + 1)
            except Exception as exc:  # the loop's own failure: the attempt's, named
                work.cancel()
                found = tool.failed(f"{type(exc).__name__}: {exc}")
            answered(found.error if found is not None else "no result before the deadline")
        return found

    def close(self) -> None:
        """Close every connection (stdio servers stopped) and the loop."""
        loop = self._loop
        if loop is None:
            return
        links = list(self._links.values())

        async def shut() -> None:
            for link in links:
                await link.close()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shut(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        self._loop = None
        self._links.clear()

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(
                    target=loop.run_forever, name="fsm-mcp-caller", daemon=True
                ).start()
                self._loop = loop
            return self._loop

    async def _call(
        self, pending: Pending, spec: McpServer, remaining: float
    ) -> tool.Outcome | None:
        name = pending.call.server
        link = self._links.get(name)
        if link is None:
            link = self._links[name] = _Link(name, spec)
        try:
            return await asyncio.wait_for(self._ask(link, pending), remaining + GRACE)
        except TimeoutError:
            return None  # the scan times the attempt out
        except Exception as exc:  # the server failed: connected anew on the next call
            await link.close()
            self._links.pop(name, None)
            return tool.failed(f"{tool.actor(pending.call)}: {type(exc).__name__}: {exc}")

    async def _ask(self, link: _Link, pending: Pending) -> tool.Outcome:
        session = await link.session()
        if pending.call.name not in link.output_schemas:  # listed once, or when it is new
            await link.list_tools()
        if pending.call.name not in link.output_schemas:
            return tool.failed(f"{tool.actor(pending.call)}: the server has no such tool")
        schema = link.output_schemas[pending.call.name]
        result = await session.call_tool(pending.call.name, pending.arguments)
        if not isinstance(result, types.CallToolResult):
            return tool.failed(f"{tool.actor(pending.call)}: not a tool result: {type(result)}")
        return self._outcome(pending, result, schema)

    def _outcome(
        self, pending: Pending, result: types.CallToolResult, schema: Mapping[str, Any] | None
    ) -> tool.Outcome:
        texts = [part.text for part in result.content if isinstance(part, types.TextContent)]
        size = len(json.dumps(result.structured_content, default=str)) + sum(map(len, texts))
        if size > self._max_bytes:
            return tool.failed(
                f"{tool.actor(pending.call)}: its result is {size} bytes, over "
                f"FSM_MAX_PAYLOAD_BYTES ({self._max_bytes})"
            )
        found = tool.outcome(result.structured_content, texts, bool(result.is_error))
        if found.success and schema is not None and not pending.declares_contract:
            problems = flaws(schema, found.output)
            if problems:
                return tool.failed(
                    f"{tool.actor(pending.call)}: its result breaks the tool's own output "
                    f"schema: {summary(problems)}"
                )
        return found


def _errlog() -> TextIO:
    """Where a stdio server's stderr goes: the process's own (a Celery worker's sys.stderr is a
    logging proxy with no file behind it)."""
    for stream in (sys.stderr, sys.__stderr__):
        try:
            if stream is not None:
                stream.fileno()
                return stream
        except (AttributeError, OSError, ValueError):
            continue
    return open(os.devnull, "w")


class _Link:
    """One server's connection: its transport and session, held open by a task of its own
    (the MCP client's contexts are entered and left in one task), until closed."""

    def __init__(self, name: str, spec: McpServer) -> None:
        self.name, self.spec = name, spec
        self.output_schemas: dict[str, dict[str, Any] | None] = {}
        self._session: ClientSession | None = None
        self._ready: asyncio.Future[ClientSession] | None = None
        self._stop = asyncio.Event()
        self._holder: asyncio.Task[None] | None = None

    async def session(self) -> ClientSession:
        if self._ready is None:
            self._ready = asyncio.get_running_loop().create_future()
            self._holder = asyncio.create_task(self._hold(self._ready))
        return await asyncio.wait_for(asyncio.shield(self._ready), CONNECT_SECONDS)

    async def list_tools(self) -> None:
        session = await self.session()
        cursor: str | None = None
        while True:
            params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
            listed = await session.list_tools(params=params)
            for found in listed.tools:
                self.output_schemas[found.name] = found.output_schema
            cursor = listed.next_cursor
            if not cursor:
                return

    async def close(self) -> None:
        self._stop.set()
        if self._holder is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self._holder, 10)

    async def _hold(self, ready: asyncio.Future[ClientSession]) -> None:
        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(self._transport(stack))
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                ready.set_result(session)
                await self._stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(exc))
            log.warning("MCP server %s: %s: %s", self.name, type(exc).__name__, exc)

    def _transport(self, stack: contextlib.AsyncExitStack) -> Any:
        spec = self.spec
        if spec.command is not None:
            command, *args = spec.command
            params = StdioServerParameters(command=command, args=args, env=spec.env, cwd=spec.cwd)
            return stdio_client(params, errlog=_errlog())
        assert spec.url is not None
        http = httpx2.AsyncClient(headers=spec.headers, timeout=httpx2.Timeout(30, read=None))
        stack.push_async_callback(http.aclose)
        return streamable_http_client(spec.url, http_client=http)
