# A fresh clone needs only python3 (3.11+): every target installs what it needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-fast bench browser clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

# Starts the router: with ./gpuq.toml it serves your nodes, without one it runs demo nodes.
run: $(STAMP)
	@if [ -f gpuq.toml ] || [ -n "$$GPUQ_CONFIG" ]; then $(BIN)/gpuq serve; else $(BIN)/gpuq serve --demo; fi

# Headless Chromium from Debian's packages for the page tests (Playwright drives it).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium >/dev/null; \
	  else sudo apt-get update -qq && sudo apt-get install -y -qq chromium >/dev/null; fi; }

test: $(STAMP) browser
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "not browser"

bench: $(STAMP)
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python -m bench.run

clean:
	rm -rf $(VENV) *.egg-info build dist .pytest_cache
