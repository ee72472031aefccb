"""A small MCP server for the tests, spoken to over stdio: `python mcp_server_stub.py`."""

import time

from mcp.server.mcpserver import MCPServer

app = MCPServer("tether-test")


@app.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@app.tool()
def explode(reason: str) -> str:
    """Always fails."""
    raise ValueError(reason)


@app.tool()
def nap(seconds: float) -> str:
    """Sleep, then answer."""
    time.sleep(seconds)
    return "awake"


if __name__ == "__main__":
    app.run("stdio")
