# Two commands set up everything on a fresh machine:
#   make run    the broker on the embedded journal store (data in ./data)
#   make test   ruff, mypy and pytest
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP_RUN := $(VENV)/.installed
STAMP_DEV := $(VENV)/.installed-dev

.PHONY: run test lint typecheck pytest setup clean java chromium

$(VENV)/bin/python:
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# The broker alone.
$(STAMP_RUN): pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install --quiet -e .
	touch $(STAMP_RUN)

# Everything the tests need: ruff, mypy, pytest, stomp.py, and the Spark connector's pyspark.
$(STAMP_DEV): pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install --quiet -e '.[dev,spark]'
	touch $(STAMP_DEV) $(STAMP_RUN)

# Spark (the connector's tests) needs a JDK 17+; install one from Debian when none is on PATH.
java:
	@command -v java >/dev/null 2>&1 || { \
		echo "installing a JDK for Spark"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends openjdk-17-jre-headless >/dev/null; }

# The console's browser tests drive Debian's Chromium and its driver (never a downloaded build).
chromium:
	@test -x /usr/bin/chromium -a -x /usr/bin/chromedriver || { \
		echo "installing chromium and chromium-driver for the browser tests"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends chromium chromium-driver fonts-dejavu-core >/dev/null; }

setup: $(STAMP_DEV)

run: $(STAMP_RUN)
	$(VENV)/bin/sluice broker --store journal --data ./data

lint: setup
	$(VENV)/bin/ruff check --no-cache src tests benchmarks examples
	$(VENV)/bin/ruff format --no-cache --check src tests benchmarks examples

typecheck: setup
	$(VENV)/bin/mypy

pytest: setup java chromium
	$(VENV)/bin/pytest $(PYTEST_ARGS)

test: lint typecheck pytest

clean:
	rm -rf $(VENV) build dist src/*.egg-info
