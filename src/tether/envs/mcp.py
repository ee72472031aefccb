"""Tools from an MCP server over stdio (Model Context Protocol; Kimi K2's many-tools setting).

    with MCPToolServer("python", ["my_server.py"]) as server:
        tools = server.tools                     # tether Tools: name, JSON schema, callable
        env = MyEnv(task, tools=tools)           # rendered and called like any Python tool

The server is a subprocess spoken to through the `mcp` package (`stdio_client` +
`ClientSession`). The session lives on a private asyncio loop in a daemon thread, inside ONE
long-lived task (anyio cancel scopes must be entered and exited by the same task); tool calls
are submitted to that loop from any thread and waited for with a deadline, so the synchronous
rollout and its per-tool timeouts (`tether.envs.tools.run_tool_calls`) work unchanged. A tool
result flagged `is_error` raises `MCPToolError`, which the tool runner turns into an error
observation. The server's stderr goes to a temporary file whose tail is quoted when start-up
fails.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import tempfile
import threading
from typing import Any, Mapping, Sequence

from tether.envs.tools import Tool


class MCPToolError(RuntimeError):
    """The MCP server reported a failed tool call (`CallToolResult.is_error`)."""


class MCPToolServer:
    """A running MCP server and the tools it lists (see module docstring). Close it (or use it
    as a context manager): closing ends the session and the subprocess."""

    def __init__(self, command: str, args: Sequence[str] = (), env: Mapping[str, str] | None = None,
                 cwd: str | None = None, startup_timeout_s: float = 60.0, call_timeout_s: float = 30.0) -> None:
        from mcp import StdioServerParameters

        self.call_timeout_s = call_timeout_s
        self._errlog = tempfile.TemporaryFile(mode="w+")
        self._params = StdioServerParameters(command=command, args=list(args), env=dict(env) if env else None, cwd=cwd)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="tether-mcp")
        self._thread.start()
        self._ready: concurrent.futures.Future = concurrent.futures.Future()
        self._closed: asyncio.Event | None = None
        self._session: Any = None
        self._main = asyncio.run_coroutine_threadsafe(self._serve(), self._loop)
        try:
            listed = self._ready.result(startup_timeout_s)
        except Exception as err:
            tail = self._stderr_tail()
            self.close()
            raise RuntimeError(f"MCP server {command} {' '.join(args)} did not start: {type(err).__name__}: {err}; "
                               f"stderr: {tail!r}") from err
        self.tools: tuple[Tool, ...] = tuple(self._as_tool(t) for t in listed)

    async def _serve(self) -> None:
        from mcp import ClientSession, stdio_client

        self._closed = asyncio.Event()
        try:
            async with stdio_client(self._params, errlog=self._errlog) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    listed = (await session.list_tools()).tools
                    self._session = session
                    self._ready.set_result(listed)
                    await self._closed.wait()
        except BaseException as err:  # start-up failure: hand it to the waiting constructor
            if not self._ready.done():
                self._ready.set_exception(err)
            if not isinstance(err, Exception):
                raise

    def _as_tool(self, t: Any) -> Tool:
        schema = {"type": "function", "function": {
            "name": t.name, "description": t.description or "",
            "parameters": dict(getattr(t, "input_schema", None) or {"type": "object"}),
        }}
        return Tool(t.name, lambda _name=t.name, **arguments: self.call(_name, arguments), schema)

    def call(self, name: str, arguments: Mapping[str, Any], timeout_s: float | None = None) -> str:
        """Call a tool and return its text content; raises MCPToolError on a failed call and
        TimeoutError past the deadline."""
        if self._session is None:
            raise RuntimeError("MCP session is closed")
        fut = asyncio.run_coroutine_threadsafe(self._session.call_tool(name, dict(arguments)), self._loop)
        try:
            result = fut.result(timeout_s or self.call_timeout_s)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise TimeoutError(f"MCP tool {name!r}: no result within {timeout_s or self.call_timeout_s:g}s") from None
        text = "\n".join(getattr(c, "text", "") for c in result.content if getattr(c, "text", None) is not None)
        if result.is_error:
            raise MCPToolError(f"MCP tool {name!r} failed: {text}")
        return text

    def _stderr_tail(self, chars: int = 600) -> str:
        try:
            self._errlog.seek(0)
            return self._errlog.read()[-chars:]
        except (OSError, ValueError):
            return ""

    def close(self) -> None:
        """End the session and the server process; idempotent."""
        if self._loop.is_closed():
            return
        if self._closed is not None:
            self._loop.call_soon_threadsafe(self._closed.set)
        try:
            self._main.result(10.0)
        except BaseException:  # already failed, or did not stop in time: the loop goes anyway
            self._main.cancel()
        self._session = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5.0)
        if not self._thread.is_alive():
            self._loop.close()
        self._errlog.close()

    def __enter__(self) -> "MCPToolServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
