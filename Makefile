# mortred-twisted: the two commands of the README, and a few helpers.
#   make run    install into .venv and start the main job: the control plane (supervisor
#               :8787 + gateway :8080 + the catalog's models), printing tokens and URLs
#   make test   install into .venv and run the whole test suite (what CI runs)
# A regular (non-editable) install is deliberate: twistd discovers the plugins only
# from an installed twisted/plugins folder.

PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
RUN_CONFIG ?= conf/server/fake/fake_async.toml
RUN_ARGS   ?=

.PHONY: run run-model test test-fast install venv lint bench clean

$(PY):
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

venv: $(PY)

install: $(PY)
	$(PY) -m pip install -q '.[test]'

run: install
	$(VENV)/bin/twistd -n --pidfile= mortred-supervisor --config conf/mortred.toml $(RUN_ARGS)

# One model server alone (no gateway, no supervisor).
run-model: install
	$(VENV)/bin/twistd -n --pidfile= mortred-model --config $(RUN_CONFIG)

test: install
	$(PY) -m pytest -q

test-fast: install
	$(PY) -m pytest -q -m 'not slow'

lint: install
	$(VENV)/bin/ruff check mortred_twisted tests bench twisted_plugins
	$(VENV)/bin/ruff format --check mortred_twisted tests bench twisted_plugins

bench: install
	$(PY) bench/async_api.py

clean:
	rm -rf build dist *.egg-info .pytest_cache
