# clockq: `make run` starts the whole system, `make test` runs the test suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# GPU hosts: make run REQUIREMENTS=requirements-gpu.txt (CUDA build of TensorFlow).
REQUIREMENTS ?= requirements.txt

.PHONY: run demo test test-all browser lint format bench clean

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

# The browser tests (tests/webapp/test_browser.py) drive Debian's Chromium; Playwright never
# downloads a browser here. Installed only when missing; without root or sudo, a note, and those
# tests skip, saying why.
CHROMIUM := /usr/bin/chromium
APT_CHROMIUM := env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium

browser:
	@if [ -x $(CHROMIUM) ]; then :; \
	elif ! command -v apt-get >/dev/null 2>&1; then \
		echo "NOTE: $(CHROMIUM) is missing and there is no apt-get: the browser tests will be skipped."; \
	elif [ "$$(id -u)" = 0 ]; then SUDO=; \
	elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo -n"; \
	else echo "NOTE: $(CHROMIUM) is missing and installing it needs root (apt-get install chromium):" \
		"the browser tests will be skipped."; fi; \
	if [ ! -x $(CHROMIUM) ] && [ -n "$${SUDO+set}" ]; then \
		echo "Installing Chromium (Debian package) for the browser tests"; \
		{ $$SUDO apt-cache show chromium >/dev/null 2>&1 && $$SUDO $(APT_CHROMIUM); } \
			|| { $$SUDO apt-get update -q && $$SUDO $(APT_CHROMIUM); } \
			|| echo "NOTE: installing chromium failed: the browser tests will be skipped."; \
	fi

test: $(STAMP) browser
	$(PY) -m pytest -m "not slow"

test-all: $(STAMP) browser
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
