# A fresh clone needs only python3 (3.11+): every target installs what it needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# gpuq and what it needs to run, all that `make run` waits for (seconds on a fresh clone); then
# the test dependencies (minutes), for the targets that test.
RUNTIME := $(VENV)/.runtime
STAMP := $(VENV)/.installed
# `make run PORT=8751` (or LISTEN=host:port) listens there instead; the environment's PORT is not used.
PORT :=
LISTEN := $(if $(PORT),127.0.0.1:$(PORT))

.PHONY: run port-free test test-fast docs lint bench browser postgres agent-clis clean

$(RUNTIME): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -e .
	touch $(RUNTIME)

$(STAMP): $(RUNTIME)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

# Starts the router: with ./gpuq.toml it serves your nodes, without one it runs demo nodes. Its
# port is checked first, with the standard library alone: a taken one is said before any install.
run: port-free $(RUNTIME)
	@if [ -f gpuq.toml ] || [ -n "$$GPUQ_CONFIG" ]; then mode=; else mode=--demo; fi; \
	  GPUQ_MAKE_RUN=1 exec $(BIN)/gpuq serve $$mode $(if $(LISTEN),--listen $(LISTEN))

port-free:
	@$(PYTHON) -m gpuq.ops.portcheck $(if $(LISTEN),--listen $(LISTEN))

# Headless Chromium from Debian's packages for the page tests (Playwright drives it).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium >/dev/null; \
	  else sudo apt-get update -qq && sudo apt-get install -y -qq chromium >/dev/null; fi; }

# PostgreSQL's server from Debian's packages for the Postgres tests (tests/pg.py starts a
# throwaway cluster per test run). Its `main` cluster is not created: nothing is left running.
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then sudo=; else sudo=sudo; fi; \
	  $$sudo apt-get update -qq && $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-common >/dev/null && \
	  $$sudo sed -i 's/^#* *create_main_cluster *=.*/create_main_cluster = false/' /etc/postgresql-common/createcluster.conf && \
	  $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; }

# Codex CLI and Claude Code from npm, into .agents/, for the tests that run them against the front
# door (tests/test_front_agents.py; they are skipped without them). The versions the tests were
# written against; without npm, nothing is installed and those tests are skipped.
AGENT_CLIS := @openai/codex@0.171.0 @anthropic-ai/claude-code@2.1.197
agent-clis:
	@command -v npm >/dev/null 2>&1 && [ ! -x .agents/node_modules/.bin/codex ] && \
	  npm install -s --no-audit --no-fund --prefix .agents $(AGENT_CLIS) || true

# The documentation site into site/ (strict: a broken link or a missing page fails the build).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# Lint and types (configured in pyproject.toml): ruff's rules (complexity included) and format,
# mypy strict on the whole package.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: $(STAMP) browser postgres agent-clis docs lint
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "not browser"

bench: $(STAMP) postgres
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python -m bench.run

clean:
	rm -rf $(VENV) *.egg-info build dist .pytest_cache site
