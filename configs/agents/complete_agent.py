"""A minimal black-box agent for `harness.command` (tether.envs.harness): one completion of the
task's prompt through the OpenAI-compatible endpoint, printed as the answer.

Standard library only (urllib), so it starts in ~50 ms: the harness launches one process per
episode. Any OpenAI client works the same way, e.g. with the `openai` package:

    from openai import OpenAI
    text = OpenAI().completions.create(model="tether", prompt=task["prompt"]).choices[0].text
"""

import json
import os
import urllib.request

task = json.loads(os.environ["TETHER_TASK"])
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/completions",
    data=json.dumps({"model": "tether", "prompt": task["prompt"]}).encode(),
    headers={"Content-Type": "application/json", "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]},
)
with urllib.request.urlopen(request, timeout=120) as response:
    text = json.load(response)["choices"][0]["text"]
print(json.dumps({"answer": text}))
