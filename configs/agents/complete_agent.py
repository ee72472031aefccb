"""A minimal black-box agent for `harness.command` (tether.rollout.harness): one completion of the
task's prompt through the OpenAI-compatible endpoint, printed as the answer.

Standard library only (http.client: about half the start-up time of urllib.request, which
matters because the harness launches one process per episode). Any OpenAI client works the same
way, e.g. with the `openai` package:

    from openai import OpenAI
    text = OpenAI().completions.create(model="tether", prompt=task["prompt"]).choices[0].text
"""

import http.client
import json
import os
from urllib.parse import urlsplit

task = json.loads(os.environ["TETHER_TASK"])
url = urlsplit(os.environ["OPENAI_BASE_URL"] + "/completions")
conn = http.client.HTTPConnection(url.hostname, url.port, timeout=120)
conn.request("POST", url.path, body=json.dumps({"model": "tether", "prompt": task["prompt"]}),
             headers={"Content-Type": "application/json", "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
response = conn.getresponse()
body = json.loads(response.read())
if response.status != 200:
    raise SystemExit(f"the endpoint answered {response.status}: {body}")
print(json.dumps({"answer": body["choices"][0]["text"]}))
