# Everything a new machine needs, from nothing: `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU torch is installed first so no dependency pulls CUDA wheels. Set TORCH_INDEX_URL
# (e.g. https://download.pytorch.org/whl/cpu) where the default index serves CUDA builds.
TORCH_VERSION ?= 2.13.0
TORCH_INDEX_URL ?=
PYTEST_ARGS ?=

.PHONY: test env clean

env: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "torch==$(TORCH_VERSION)" $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL))
	$(PY) -m pip install -q -e ".[test]"
	touch $@

test: env
	$(PY) -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
