# Every target builds what it needs: a fresh clone needs only `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.installed-bench
BENCH_ARGS ?=

.PHONY: install demo test lint typecheck unit bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m dtask.local.demo

lint: $(STAMP)
	$(BIN)/ruff check dtask tests migrations celeryconfig.py
	$(BIN)/ruff format --check dtask tests migrations celeryconfig.py
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest tests/unit -q

test: lint typecheck
	$(BIN)/pytest -q

$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	touch $(BENCH_STAMP)

# Not part of `make test`: ~15 minutes; writes docs/benchmarks.md and docs/benchmarks/*.png.
bench: $(BENCH_STAMP)
	$(BIN)/python -m bench.run $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .dtask .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
