# Two commands set up everything on a fresh machine:
#   make run    the broker on the embedded journal store (data in ./data)
#   make test   ruff, mypy and pytest
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP_RUN := $(VENV)/.installed
STAMP_DEV := $(VENV)/.installed-dev

.PHONY: run test lint typecheck pytest setup clean java browser postgres

$(VENV)/bin/python:
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# The broker alone.
$(STAMP_RUN): pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install --quiet -e .
	touch $(STAMP_RUN)

# Everything the tests need: ruff, mypy, pytest, stomp.py, the Spark connector's pyspark, and
# psycopg for the PostgreSQL store.
$(STAMP_DEV): pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install --quiet -e '.[dev,spark,postgres]'
	touch $(STAMP_DEV) $(STAMP_RUN)

# Spark (the connector's tests) needs a JDK 17+; install one from Debian when none is on PATH.
java:
	@command -v java >/dev/null 2>&1 || { \
		echo "installing a JDK for Spark"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends openjdk-17-jre-headless >/dev/null; }

# The browser tests: Debian's Chromium and its driver (never a browser download), npm for
# the JavaScript libraries their pages load, and a font for the console's screenshots.
browser:
	@{ command -v chromium && command -v chromedriver && command -v npm; } >/dev/null 2>&1 || { \
		echo "installing chromium, chromium-driver and npm for the browser tests"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends chromium chromium-driver npm fonts-dejavu-core >/dev/null; }

# Those libraries, at the versions of the lockfile, from the npm registry.
JS := tests/browser/js
$(JS)/node_modules/.package-lock.json: $(JS)/package.json $(JS)/package-lock.json | browser
	cd $(JS) && npm ci --no-audit --no-fund --loglevel=error

# The PostgreSQL store's tests start throwaway servers with Debian's initdb and pg_ctl.
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
		echo "installing PostgreSQL for the store tests"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends postgresql >/dev/null; }

setup: $(STAMP_DEV)

run: $(STAMP_RUN)
	$(VENV)/bin/sluice broker --store journal --data ./data

lint: setup
	$(VENV)/bin/ruff check --no-cache src tests benchmarks examples
	$(VENV)/bin/ruff format --no-cache --check src tests benchmarks examples

typecheck: setup
	$(VENV)/bin/mypy

pytest: setup java postgres browser $(JS)/node_modules/.package-lock.json
	$(VENV)/bin/pytest $(PYTEST_ARGS)

test: lint typecheck pytest

clean:
	rm -rf $(VENV) build dist src/*.egg-info $(JS)/node_modules
