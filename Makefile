# Two entry points: `make test` (which runs `make lint` first) and `make demo`. Both create .venv
# when missing and install the project into it; the install re-runs only when pyproject.toml
# changes (a stamp file records it).
# `make test` also installs what its tests need outside Python (.ci/bootstrap.sh: Chromium and
# chromedriver, only when missing, saying so), so a second `make test` installs nothing.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.counterfactory-installed
# Project-local NLTK data (an offline tagger trained on the shipped corpus), see docs/setup.md ("NLTK data").
export NLTK_DATA ?= $(CURDIR)/.nltk_data
export COUNTERFACTORY_CACHE ?= $(CURDIR)/.cache
# Test files run on this many workers (pytest-xdist), each file whole on one worker so its
# module fixtures are built once; tests that launch processes pick free ports.
TEST_WORKERS ?= 2

.PHONY: install system-deps lint test test-fast demo clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --disable-pip-version-check -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

system-deps:
	@bash .ci/bootstrap.sh

# ruff, pinned in the dev extra, configured in pyproject.toml: its error rules (not style), and the
# formatting (`ruff format .` fixes what `--check` finds).
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# Lint first: it takes seconds, and the browser install and the suite take minutes. The 25 slowest
# tests are listed at the end, to keep the suite within CI's 30 idle minutes.
test: $(STAMP) lint system-deps
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=25

# The unit tier, for the inner loop: every test but the end-to-end ones (marked `e2e`: the CLI in a
# subprocess, `accelerate launch`, the browser, clean virtualenvs, the README's commands, full
# builds and publishing; tests/README.md) and the unit tests of seconds or more (marked `slow`:
# diffusion and caption-model runs on the CPU), and no Chromium. Measured in a fresh clone on 2 idle
# cores (2026-11-27): 63 s of pytest, 3.0 min with the venv's creation; 114 s of pytest in place on a
# slower day (2026-11-29, 1,060 tests; 154 s with two threads a worker); `make test`: 22.0-25.0 min (2026-11-29, 1,846 tests).
test-fast: $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile -m "not e2e and not slow"

demo: $(STAMP)
	$(PY) -m builders.app.demo --workdir demo_output

clean:
	rm -rf demo_output .pytest_cache .cache .nltk_data
