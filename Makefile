# tether — the only two commands a newcomer needs are `make demo` and `make test`.
# Both create .venv if it is missing and install everything they need into it.
#
# TORCH_SPEC pins the CPU wheel that lies on the build machines; a GPU user overrides it, e.g.
#   make demo TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
TORCH_SPEC ?= torch==2.13.0
PYTHON ?= python3
VENV ?= .venv
EXTRAS ?= dev,ray,mcp,bench,tinker
PY := $(VENV)/bin/python
STAMP := $(VENV)/.tether-installed

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export RAY_AUTH_MODE := disabled

.PHONY: demo test test-fast bench bench-quick gpu-check results install clean extra-venvs

# Second virtualenvs for the real ecosystem packages whose pins clash with tether's (docs/byo.md); the tests
# talk to them over loopback. OpenEnv: openenv 0.10.0 requires gradio (its web UI, which pins pillow < 13) and
# fastmcp; the environment server and `openenv init` import neither gradio nor anything tether's pins forbid,
# so openenv goes in --no-deps with the modules they do import (~45 s on the build machine).
VENV_OPENENV ?= .venv-openenv
OPENENV_STAMP := $(VENV_OPENENV)/.tether-installed
OPENENV_DEPS := fastapi uvicorn pydantic websockets typer rich pyyaml requests "fastmcp>=3,<4" "huggingface_hub>=1.29" \
	tomli tomli-w "openai>=2.7.2" jsonschema packaging
# verifiers 0.4 pins openai < 3 and mcp 2.0 (tether's environment has openai 3 and mcp 2.3): its own virtualenv,
# with uv, which verifiers' agent harness uses to run its chat program (docs/byo.md).
VENV_VERIFIERS ?= .venv-verifiers
VERIFIERS_STAMP := $(VENV_VERIFIERS)/.tether-installed
extra-venvs: $(OPENENV_STAMP) $(VERIFIERS_STAMP)

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch goes in the same command as the project so that nothing pulls a CUDA build.
	$(PY) -m pip install --quiet $(TORCH_SPEC) -e ".[$(EXTRAS)]"
	# bubblewrap is the strong backend of the code sandbox (envs/sandbox.py); best effort, never fatal.
	-command -v bwrap >/dev/null || (command -v apt-get >/dev/null && (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap)) >/dev/null 2>&1) || true
	# Debian's chromium renders `tether report` pages in the headless screenshot test; best effort, never fatal.
	-test -x /usr/bin/chromium || (command -v apt-get >/dev/null && (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium)) >/dev/null 2>&1) || true
	touch $(STAMP)

$(OPENENV_STAMP): Makefile
	test -x $(VENV_OPENENV)/bin/python || $(PYTHON) -m venv $(VENV_OPENENV)
	$(VENV_OPENENV)/bin/python -m pip install --quiet --no-deps openenv==0.10.0
	$(VENV_OPENENV)/bin/python -m pip install --quiet --no-warn-conflicts $(OPENENV_DEPS)
	touch $@

$(VERIFIERS_STAMP): Makefile
	test -x $(VENV_VERIFIERS)/bin/python || $(PYTHON) -m venv $(VENV_VERIFIERS)
	$(VENV_VERIFIERS)/bin/python -m pip install --quiet verifiers==0.4.0 uv
	# the wheels of the chat program verifiers' harness runs (a uv script): episodes then read them from here
	# (vf1_driver.py sets UV_NO_INDEX), so the tests send nothing beyond loopback
	$(VENV_VERIFIERS)/bin/python src/tether/envs/vf1_driver.py wheels $(VENV_VERIFIERS)/wheels
	touch $@

demo: $(STAMP)
	$(VENV)/bin/tether demo

test: $(STAMP) $(OPENENV_STAMP) $(VERIFIERS_STAMP)
	$(PY) -m pytest -q -n 2 --dist loadgroup tests

test-fast: $(STAMP)
	$(PY) -m pytest -q -n 2 -m "not slow" tests

# tether vs TRL side by side (both sizes, ablations, prefix sharing, learning curves; ~1 h on 2 busy
# cores) -> benchmarks/results/vs_trl.json. A smoke run: make bench BENCH_ARGS=--quick
BENCH_ARGS ?=
bench: $(STAMP)
	$(PY) benchmarks/vs_trl.py $(BENCH_ARGS)

# the regression guard (~2-3 min): small model, tether (defaults) vs TRL (fp32) in one sitting; exits 1 if the
# tether/TRL s/step ratio is > 15% worse than benchmarks/results/baseline_quick.json for this CPU class.
# Refresh the baseline: make bench-quick BENCH_QUICK_ARGS=--update (docs/performance.md)
BENCH_QUICK_ARGS ?=
bench-quick: $(STAMP)
	$(PY) benchmarks/bench_quick.py $(BENCH_QUICK_ARGS)

# GPU validation (vLLM, FSDP2, LoRA) in one script, <= 8 min on one GPU -> gpu_check.json; on a CPU
# it runs the CPU-safe parts and says which GPU parts it skipped (docs/distributed.md)
gpu-check: $(STAMP)
	$(PY) benchmarks/gpu_check.py --out gpu_check.json

# docs/results.md and the README's headline lines, regenerated from the committed result files
# (tools/gen_results.py; stdlib only, no install needed). tests/unit/test_results_doc.py checks they are current.
results:
	$(PYTHON) tools/gen_results.py

clean:
	rm -rf $(VENV) $(VENV_OPENENV) $(VENV_VERIFIERS) runs .pytest_cache
