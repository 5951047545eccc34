# clockq: `make run` starts the whole system, `make test` runs the test suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# GPU hosts: make run REQUIREMENTS=requirements-gpu.txt (CUDA build of TensorFlow).
REQUIREMENTS ?= requirements.txt

.PHONY: run demo test test-all lint format bench clean

$(STAMP): $(REQUIREMENTS) requirements-base.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r $(REQUIREMENTS) -r requirements-dev.txt
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(PY) manage.py runstack

demo: $(STAMP)
	$(PY) manage.py runstack --demo

test: $(STAMP)
	$(PY) -m pytest -m "not slow"

test-all: $(STAMP)
	$(PY) -m pytest

# The layer contracts (pyproject.toml, [tool.importlinter]), ruff, and mypy on the core and workers.
lint: $(STAMP)
	$(VENV)/bin/lint-imports --no-logo
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy --ignore-missing-imports clockq workers

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench: $(STAMP)
	$(PY) bench/switch_cost.py

clean:
	rm -rf $(VENV) var .pytest_cache .ruff_cache
