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

.PHONY: demo test test-fast bench bench-quick gpu-check results install clean

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

demo: $(STAMP)
	$(VENV)/bin/tether demo

test: $(STAMP)
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
	rm -rf $(VENV) runs .pytest_cache
