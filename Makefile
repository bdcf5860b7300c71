# outbox-relay: `make demo` and `make test` work on a fresh clone (they install first).
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed-stamp
PYTEST_ARGS ?=
# Parallel test processes (pytest-xdist): each has its own databases, broker names and ports.
TEST_WORKERS ?= 4
BROKER ?=

.PHONY: install demo test test-fast test-unit lint format bench services clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

# `make demo BROKER=amqp://guest:guest@127.0.0.1:5672/` (or kafka://host:9092) runs the jobs
# through a relay and that broker; the URL goes by the environment, so make never echoes it.
demo: export OUTBOX_DEMO_BROKER = $(BROKER)
demo: install
	$(BIN)/outbox demo --dsn sqlite:///outbox-demo.db

services:
	bash scripts/ensure-services.sh

test: install services
	bash scripts/ensure-promtool.sh
	bash scripts/ensure-chromium.sh
	$(BIN)/pytest -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

# The inner loop: tests/unit and the integration tests on SQLite (those that also publish
# to a broker still need RabbitMQ; Kafka is started by the fixtures).
test-fast: install
	bash scripts/ensure-promtool.sh
	$(BIN)/pytest -n 2 --dist worksteal tests/unit tests/integration -k "unit or sqlite" $(PYTEST_ARGS)

test-unit: install
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python scripts/check_security.py
	$(BIN)/lint-imports --no-cache --no-logo

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: install services
	bash scripts/ensure-stat-statements.sh
	$(BIN)/python bench/store.py
	$(BIN)/python bench/cost.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache outbox-demo.db*
