"""A black-box agent that uses the official `openai` client's chat API (`chat.completions`), for
`harness.command` (tether.rollout.harness). It sends the task as a user message (or the task's own
chat messages, verl's layout) and answers with the reply. Train it on a task whose model was
trained through the chat template (`data.chat=true`): a raw-prompt model scores ~0 through the chat
API, and tether warns at the first request when the formats differ (tether.rollout.prompt_format).

    tether pipeline configs/reverse.yaml data.chat=true harness.command='[python, configs/agents/chat_agent.py]'

Both harness modes (tether.rollout.agent_io): one process per episode (TETHER_TASK in, the result
as the last stdout line), or `harness.persistent=true`, where the process serves one episode per
JSON line on stdin and writes one JSON result line per episode on stdout (logs go to stderr).
"""

import json
import os
import sys

from openai import OpenAI


def play(task: dict, base_url: str) -> str:
    client = OpenAI(base_url=base_url, api_key=os.environ["OPENAI_API_KEY"], max_retries=0)
    messages = task.get("messages") or [{"role": "user", "content": task["prompt"]}]
    reply = client.chat.completions.create(model="tether", messages=messages)
    return reply.choices[0].message.content or ""


if os.environ.get("TETHER_AGENT_MODE") == "persistent":
    for line in sys.stdin:
        request = json.loads(line)
        try:
            result = {"answer": play(request["task"], request["base_url"])}
        except Exception as err:  # this episode fails; the process serves the next one
            print(f"episode {request['episode_id']}: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
            result = {"error": f"{type(err).__name__}: {err}"}
        print(json.dumps({"episode_id": request["episode_id"], **result}), flush=True)
else:
    answer = play(json.loads(os.environ["TETHER_TASK"]), os.environ["OPENAI_BASE_URL"])
    print(json.dumps({"answer": answer}))
