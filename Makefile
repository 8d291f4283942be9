# Two entry points: `make test` and `make demo`. Both create .venv when missing and install the
# project into it; the install re-runs only when pyproject.toml changes (a stamp file records it).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.counterfactory-installed
# Project-local NLTK data (an offline tagger trained on the shipped corpus), see README.
export NLTK_DATA ?= $(CURDIR)/.nltk_data
export COUNTERFACTORY_CACHE ?= $(CURDIR)/.cache

.PHONY: install test demo clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --disable-pip-version-check -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest

demo: $(STAMP)
	$(PY) -m builders.infra.demo --workdir demo_output

clean:
	rm -rf demo_output .pytest_cache .cache .nltk_data
