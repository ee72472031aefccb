"""Runs a verifiers 0.4 (`verifiers.v1`) taskset for tether, inside the virtualenv that has verifiers.

This file imports only verifiers and the standard library: tether runs it with the other
virtualenv's interpreter (`data.task_kwargs.python`; `make test` builds `.venv-verifiers`), because
verifiers 0.4 pins openai < 3 and mcp 2.0, which tether's own environment has newer. It is not
imported by tether.

    python vf1_driver.py list TASKSET_ID ARGS_JSON
        -> one JSON line: [{"idx": 0, "prompt": "..."}, ...]        (the taskset's tasks)
    python vf1_driver.py run TASKSET_ID ARGS_JSON IDX BASE_URL EPISODE_ID TIMEOUT_S
        -> one JSON line: {"reward": r, "error": null | "..."}         (one episode, scored)
    python vf1_driver.py wheels DIR
        -> the wheels of the chat program's packages (its PEP 723 header) downloaded into DIR;
           `make` runs this when it builds the virtualenv, the install step's only index traffic

An episode is verifiers' own: `SingleAgentEnv` over the taskset, its `null` harness (the chat
program verifiers ships, run as a local subprocess) whose model calls go through verifiers'
interception proxy to BASE_URL — tether's OpenAI-compatible endpoint, with the header
`X-Tether-Episode: EPISODE_ID` so that tether captures the episode's tokens — then the task's
`@reward` methods score the trace. The API key is read from OPENAI_API_KEY.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

# Run by path, this file's folder (tether's envs package) would come first on sys.path and shadow
# installed packages of the same name (tether.envs.mcp is not the mcp that verifiers imports).
if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)


def _env(taskset_id: str, args: dict):
    import verifiers.v1 as vf
    from verifiers.v1.harnesses.null import NullHarnessConfig
    from verifiers.v1.taskset import Taskset
    from verifiers.v1.utils.generic import concrete_type
    from verifiers.v1.utils.loaders import taskset_class

    # the taskset's own config class, so that its fields (ARGS_JSON) are kept
    config_cls = concrete_type(taskset_class(taskset_id), vf.TasksetConfig, origin=Taskset) or vf.TasksetConfig
    taskset = config_cls(id=taskset_id, **args)
    agent = vf.AgentConfig(runtime=vf.SubprocessConfig(), harness=NullHarnessConfig())
    return vf.SingleAgentEnv(vf.SingleAgentEnvConfig(taskset=taskset, agent=agent))


def list_tasks(taskset_id: str, args: dict) -> list[dict]:
    env = _env(taskset_id, args)
    return [{"idx": i, "prompt": t.data.prompt_text} for i, t in enumerate(env.taskset)]


async def run_episode(taskset_id: str, args: dict, idx: int, base_url: str, episode_id: str, timeout_s: float) -> dict:
    from verifiers.v1.clients.client import ModelContext
    from verifiers.v1.configs.client import EvalClientConfig

    env = _env(taskset_id, args)
    task = next(t for i, t in enumerate(env.taskset) if i == idx)
    client = EvalClientConfig(base_url=base_url, api_key_var="OPENAI_API_KEY", headers={"X-Tether-Episode": episode_id})
    async with env.serving():
        episode = await asyncio.wait_for(env.run_episode(task, ModelContext(model="tether", client=client)), timeout_s)
    if episode.errors or not episode.traces:
        return {"reward": None, "error": "; ".join(e.message[:300] for e in episode.errors) or "no trace"}
    trace = episode.traces[0]
    if not trace.ok:
        problems = "; ".join(f"{e.type}: {e.message}" for e in trace.errors) or "the trace is not ok"
        return {"reward": None, "error": problems[:500]}
    return {"reward": float(trace.reward), "error": None}


def wheelhouse() -> str:
    """The folder `make` fills with the chat program's wheels: beside this virtualenv's bin/."""
    return os.path.join(os.path.dirname(os.path.dirname(sys.executable)), "wheels")


def download_wheels(dest: str) -> None:
    """Download the chat program's dependencies (and theirs) as wheels for this interpreter into `dest`."""
    import re
    import subprocess

    from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE

    header = re.search(r"^# dependencies = (\[.*\])$", CHAT_PROGRAM_SOURCE, re.MULTILINE)
    if header is None:
        raise SystemExit("vf1_driver: the chat program has no PEP 723 dependency line (a verifiers change?)")
    deps = json.loads(header.group(1))
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "-d", dest, *deps],
                   check=True)


def use_local_packages() -> None:
    """verifiers' harness syncs its chat program's environment with uv (and sets UV_OFFLINE=false for it):
    point uv at the wheelhouse `make` filled and no Python download, so that an episode sends nothing
    beyond loopback. `--no-index` has no environment variable: the wheelhouse is also the default index,
    a local folder index with no package folders, so every candidate comes from the wheels (find-links).
    Without a wheelhouse uv falls back to its index (a manual setup)."""
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")  # our uv first
    wheels = wheelhouse()
    if os.path.isdir(wheels):
        os.environ.update(UV_DEFAULT_INDEX=f"file://{wheels}", UV_FIND_LINKS=wheels, UV_PYTHON_DOWNLOADS="never",
                          UV_PYTHON=sys.executable)


def main(argv: list[str]) -> None:
    if argv[0] == "wheels":
        download_wheels(argv[1])
        return
    use_local_packages()
    cmd, taskset_id, args = argv[0], argv[1], json.loads(argv[2])
    if cmd == "list":
        out: object = list_tasks(taskset_id, args)
    else:
        idx, base_url, episode_id, timeout_s = int(argv[3]), argv[4], argv[5], float(argv[6])
        out = asyncio.run(run_episode(taskset_id, args, idx, base_url, episode_id, timeout_s))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
