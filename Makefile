# clockq: `make run` starts the whole system, `make test` runs the test suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# GPU hosts: make run REQUIREMENTS=requirements-gpu.txt (CUDA build of TensorFlow).
REQUIREMENTS ?= requirements.txt

.PHONY: run demo ports test test-all browser sandbox prometheus compose lint docs format bench clean

# The last install puts the `clockq` command (pyproject.toml's [project.scripts]) in .venv/bin,
# editable: it runs this checkout's clockq_cli/, so an edit needs no reinstall.
$(STAMP): $(REQUIREMENTS) requirements-base.txt requirements-dev.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r $(REQUIREMENTS) -r requirements-dev.txt
	$(PY) -m pip install --quiet --editable .
	touch $(STAMP)

venv: $(STAMP)

# The ports first (web, Flower, the embedded Redis), with the system's python3 and nothing
# installed: what an earlier start of this checkout left running (its supervisor killed) is
# stopped first (clockq/stack/leftovers.py); then a taken port stops `make run` before the
# install, saying which and how to choose another; a taken Redis port is replaced by a free one,
# recorded in var/redis.url.
ports:
	@$(PYTHON) clockq/stack/leftovers.py
	@$(PYTHON) clockq/stack/ports.py

run: ports $(STAMP) sandbox
	$(PY) manage.py runstack

demo: ports $(STAMP) sandbox
	$(PY) manage.py runstack --demo

# Debian packages that parts of clockq need, installed only when missing: with neither root nor
# sudo, a note says what is missing and what does without it.
# $(call apt_need,BINARY,PACKAGE,WHAT IS MISSED WITHOUT IT)
define apt_need
	@if [ -x $(1) ]; then :; \
	elif ! command -v apt-get >/dev/null 2>&1; then \
		echo "NOTE: $(1) is missing and there is no apt-get: $(3)."; \
	elif [ "$$(id -u)" = 0 ]; then SUDO=; \
	elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo -n"; \
	else echo "NOTE: $(1) is missing and installing it needs root (apt-get install $(2)): $(3)."; fi; \
	if [ ! -x $(1) ] && [ -n "$${SUDO+set}" ]; then \
		echo "Installing $(2) (Debian package)"; \
		APT="env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(2)"; \
		{ $$SUDO apt-cache show $(2) >/dev/null 2>&1 && $$SUDO $$APT; } \
			|| { $$SUDO apt-get update -q && $$SUDO $$APT; } \
			|| echo "NOTE: installing $(2) failed: $(3)."; \
	fi
endef

# The browser tests (tests/webapp/test_browser.py) drive Debian's Chromium; Playwright never
# downloads a browser here.
browser:
	$(call apt_need,/usr/bin/chromium,chromium,the browser tests will be skipped)

# Command jobs run in a bubblewrap sandbox (workers/sandbox.py), on a network of their own that
# slirp4netns connects outwards (workers/program_network.py); without either they are refused.
sandbox:
	$(call apt_need,/usr/bin/bwrap,bubblewrap,command jobs will be refused and their tests skipped)
	$(call apt_need,/usr/bin/slirp4netns,slirp4netns,command jobs will be refused unless CLOCKQ_COMMAND_NETWORK is none or host)

# compose/prometheus's config, rules and alert unit tests are checked with promtool, and a test runs
# the Prometheus server against a live clockq (tests/compose/); Debian's package ships both.
prometheus:
	$(call apt_need,/usr/bin/promtool,prometheus,the Prometheus tests will be skipped)

# compose/compose.yaml is checked with Debian's docker-compose (`config`; no Docker engine is needed or
# started) in tests/compose/test_compose_file.py.
compose:
	$(call apt_need,/usr/bin/docker-compose,docker-compose,the docker-compose check of compose/compose.yaml will be skipped)

# The suite in TEST_PROCESSES processes (pytest-xdist), a test file to each at a time, so that a
# module's shared fixtures (the browser) start once: each process has its own Redis, database and
# program uids (tests/conftest.py). TEST_PROCESSES=0 runs it in this one process.
TEST_PROCESSES ?= 2
PYTEST_PROCESSES = $(if $(filter 0,$(TEST_PROCESSES)),,-n $(TEST_PROCESSES) --dist loadfile)

test: $(STAMP) browser sandbox prometheus compose
	$(PY) -m pytest -m "not slow" $(PYTEST_PROCESSES)

# Then the slow ones (soak, load, many hosts, the long end-to-end runs), one at a time: they time
# what they run, and the many-hosts test makes network namespaces.
test-all: test
	$(PY) -m pytest -m slow

# The layer contracts (pyproject.toml, [tool.importlinter]), ruff, mypy on the core, the GPU
# worker and the control plane, and the documentation site built with --strict (a broken link
# fails it).
lint: $(STAMP) docs
	$(VENV)/bin/lint-imports --no-logo
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy --ignore-missing-imports clockq workers control clockq_cli

# The documentation site (mkdocs.yml, docs/) into var/site, which git ignores. Not --quiet: it
# hides the warnings that --strict counts, and the build then passes whatever is broken.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir var/site

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench: $(STAMP)
	$(PY) bench/switch_cost.py

clean:
	rm -rf $(VENV) var .pytest_cache .ruff_cache
