"""Runs `tether` CLI invocations in forked children of one process (imports paid once), for the
kill -9 resume test. argv[1]: a JSON list of jobs {"args": [...], "env": {...}, "log": path};
prints one JSON list: each child's exit code, or -9 when it was SIGKILLed.

Forking is safe here: this process imports torch/transformers but computes nothing before the
forks (no thread pools exist yet); each child runs one command and exits with os._exit.
"""

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
# Imported once, before any fork; most of a tiny run's time is these imports (several are lazy:
# torch's deterministic mode pulls in dynamo/inductor, transformers its model classes, plots matplotlib).
import matplotlib.pyplot  # noqa: E402,F401
import torch._dynamo  # noqa: E402,F401
import torch._inductor  # noqa: E402,F401
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402,F401

import tether.cli  # noqa: E402
import tether.io.plots  # noqa: E402,F401
import tether.policy.tiny  # noqa: E402,F401
import tether.recipes.rl  # noqa: E402,F401


def run_child(job: dict) -> int:
    pid = os.fork()
    if pid == 0:
        fd = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.environ.update(job.get("env", {}))
        sys.argv = ["tether", *job["args"]]
        code = 1
        try:
            tether.cli.main()
            code = 0
        except SystemExit as err:
            code = err.code if isinstance(err.code, int) else 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


if __name__ == "__main__":
    print(json.dumps([run_child(job) for job in json.loads(sys.argv[1])]))
