# The README's two commands are `make demo` and `make test`; .ci/run runs `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo plan-demo test test-slow soak lint bench clean

$(BIN)/raypack: pyproject.toml
	$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "raypack needs Python >= 3.11")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $@

# Pack a built-in corpus (this Python's standard library sources) with a built-in tokenizer, offline.
demo: $(BIN)/raypack
	$(BIN)/raypack demo

# Dry run on the built-in length sample: which algorithm and seq_len, before any cluster time.
plan-demo: $(BIN)/raypack
	$(BIN)/raypack plan --sample 1000000 --seq-len 2048 8192 --algorithm all

lint: $(BIN)/raypack
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: lint
	$(BIN)/pytest

test-slow: $(BIN)/raypack
	$(BIN)/pytest -m slow

soak: $(BIN)/raypack
	$(BIN)/pytest -m slow -s tests/test_soak.py

bench: $(BIN)/raypack
	$(BIN)/python benchmarks/bench_packing.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis raypack-demo
