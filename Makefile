# `make test` runs every check and test; `make bench` the benchmarks. Everything else is plumbing.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv test test-kafka lint typecheck unit bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy .

unit: $(STAMP)
	$(BIN)/pytest -q tests/unit tests/contract

# The whole suite: lint, types, then every test (unit, contract, integration on the selected broker).
test: lint typecheck
	$(BIN)/pytest -q; rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc

# The integration suite again, on an Apache Kafka broker assembled from Maven Central (CI tier).
test-kafka: $(STAMP)
	PREFLIGHT_BROKER=kafka $(BIN)/pytest -q -m integration; rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc

bench: $(STAMP)
	$(BIN)/python bench/engine.py
	$(BIN)/python bench/fold.py
	$(BIN)/python bench/projector.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build *.egg-info
