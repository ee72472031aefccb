"""Multi-turn environments: the Env protocol, context builders, tool calling, MCP, the sandbox.

Importing the package registers the built-in environments (`tether.envs.builtin`) in `ENVS`
and, as tasks, in `tether.tasks.TASKS`.
"""

from tether.envs.base import (
    ENVS,
    Action,
    Env,
    EnvSpec,
    Observation,
    StepResult,
    Transition,
    make_env,
    register_env,
    run_expert_episode,
)
from tether.envs.tools import Tool, ToolCall, make_tool, parse_tool_calls, run_tool_calls
from tether.types import Message
from tether.envs.mcp import MCPToolServer
from tether.envs import builtin  # noqa: F401,E402  (registration)
from tether.envs import mcp_env, openenv, verifiers_env  # noqa: F401,E402  (registration: MCP from the config, OpenEnv, verifiers)

__all__ = [
    "ENVS",
    "Action",
    "Env",
    "EnvSpec",
    "MCPToolServer",
    "Message",
    "Observation",
    "StepResult",
    "Tool",
    "ToolCall",
    "Transition",
    "make_env",
    "make_tool",
    "parse_tool_calls",
    "register_env",
    "run_expert_episode",
    "run_tool_calls",
]
