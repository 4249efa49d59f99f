# The README's two commands are `make demo` and `make test`; .ci/run runs `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# MosaicML streaming, the MDS output's client, in an environment of its own: it needs numpy < 2.2,
# transformers < 5 and a torchvision that matches its torch, none of which .venv can hold. The
# pairs below are the ones whose torchvision imports (x86_64: a CUDA build, ~6 GB, from the local
# wheel mirror where there is one; aarch64: a CPU build).
MDS_VENV ?= .venv-mds
MDS_TORCH := $(if $(filter aarch64 arm64,$(shell uname -m)),torch==2.9.1 torchvision==0.24.1,torch==2.14.1 torchvision==0.29.1)

# Real model tokenizers for the tests (tests/real_tokenizers.py): the files Mistral ships inside its
# mistral-common wheel (SentencePiece models v1-v7, tekken), read from the wheel itself; the package
# is not installed (it pins numpy < 2.4 on Python 3.11, which .venv does not hold).
WHEELS ?= .cache/wheels
MISTRAL_COMMON := mistral_common-1.13.1-py3-none-any.whl
AI21 := ai21_tokenizer-1.1.0-py3-none-any.whl
DJANGO := django-5.2.8-py3-none-any.whl

.PHONY: demo plan-demo test test-fast test-slow soak lint browser mds-client real-tokenizers bench-inputs bench report-screenshot clean

# Two installs into the one .venv, each with its stamp: `make demo` (and plan-demo) needs raypack's
# runtime dependencies only (`pip install -e .`); `make test`, lint and the rest need the test stack
# too (torch, transformers, megatron-core, OLMo-core, TRL, SeaweedFS...), which the dev stamp adds to
# the same .venv. Either reinstalls when pyproject.toml changes; the dev install stands for the
# runtime one, so `make demo` after `make test` installs nothing.
RUNTIME := $(VENV)/.runtime-installed
DEV := $(VENV)/.dev-installed

$(BIN)/python:
	$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "raypack needs Python >= 3.11")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# No numba warm-up here: the demo's job compiles only what it runs (~5 s), the warm-up every packer
# (~7 s) ahead of it: the first `raypack demo` took 9.5-11.6 s without, 13.8-15.6 s with (2 cores).
$(RUNTIME): pyproject.toml | $(BIN)/python
	if [ ! $(DEV) -nt pyproject.toml ]; then $(BIN)/python -m pip install --quiet -e .; fi
	touch $@

$(DEV): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	# Megatron-Bridge collates output.format bridge in tests/chat/: 0.3.1 is its newest for
	# Python 3.11; without its dependencies (Transformer Engine, NeMo...), which its data module
	# does not need.
	$(BIN)/python -m pip install --quiet --no-deps "megatron-bridge==0.3.1"
	$(BIN)/python -m raypack.packing.warmup
	touch $@ $(RUNTIME)

# Pack a built-in corpus (this Python's standard library sources) with a built-in tokenizer, offline.
demo: $(RUNTIME)
	$(BIN)/raypack demo

# Dry run on the built-in length sample: which algorithm and seq_len, before any cluster time.
plan-demo: $(RUNTIME)
	$(BIN)/raypack plan --sample 1000000 --seq-len 2048 8192 --algorithm all

lint: $(DEV)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The report's test renders the page in headless Chromium (Debian's package): installed here when
# missing, as root with apt-get; elsewhere that one test is skipped (and fails when CI is set).
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing chromium (apt-get) for the report's browser test"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else echo "note: no chromium: the report's browser test will be skipped"; fi

$(MDS_VENV)/bin/python:
	$(PYTHON) -m venv $(MDS_VENV)
	$(MDS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(MDS_VENV)/bin/python -m pip install --quiet "mosaicml-streaming==0.13.0" $(MDS_TORCH)

mds-client: $(MDS_VENV)/bin/python

$(WHEELS)/$(MISTRAL_COMMON): $(DEV)
	$(BIN)/python -m pip download --quiet --no-deps --dest $(WHEELS) "mistral-common==1.13.1"

$(WHEELS)/$(AI21): $(DEV)
	$(BIN)/python -m pip download --quiet --no-deps --dest $(WHEELS) "ai21-tokenizer==1.1.0"

$(WHEELS)/$(DJANGO): $(DEV)
	$(BIN)/python -m pip download --quiet --no-deps --dest $(WHEELS) "Django==5.2.8"

real-tokenizers: $(WHEELS)/$(MISTRAL_COMMON)

# What benchmarks/bench_backends.py reads beyond the tests' tokenizers (not on `make test`'s path):
# AI21's Unigram model (tests/real_tokenizers.j2_unigram) and Django's message catalogs (its
# multilingual corpus).
bench-inputs: real-tokenizers $(WHEELS)/$(AI21) $(WHEELS)/$(DJANGO)

# Two pytest-xdist workers, a module at a time (tests/conftest.py): 14-15 min on 2 cores, 19 on one.
# A bare `pytest` runs in one process (for -s, --pdb, a single test).
XDIST := -n 2 --dist loadfile

test: lint browser mds-client real-tokenizers
	$(BIN)/pytest $(XDIST)

# The inner loop's tier (~30 s on 2 cores): the pure rooms (packers, config, metrics, mixtures, the
# formats' byte writers, the lease) and the house's rules; no job, no Ray, no compile of the packers.
FAST := tests/packing tests/test_config.py tests/test_architecture.py tests/test_metrics.py \
	tests/test_mixture.py tests/formats/test_fixed_lists.py tests/formats/test_joined.py \
	tests/dataset/test_lease.py tests/test_config_reference.py tests/test_docs_links.py \
	--ignore=tests/packing/test_numba_cache.py

test-fast: $(DEV)
	$(BIN)/pytest $(XDIST) $(FAST)

test-slow: $(DEV)
	$(BIN)/pytest -m slow $(XDIST)

soak: $(DEV)
	$(BIN)/pytest -m slow -s tests/test_soak.py

bench: $(DEV)
	$(BIN)/python benchmarks/bench_packing.py

# docs/report.png (the README's picture): the demo's report, its top 1200 px, as headless Chromium draws it.
report-screenshot: $(DEV) demo browser
	chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
	  --disable-background-networking --disable-component-update --disable-sync \
	  --user-data-dir=$$(mktemp -d) --force-device-scale-factor=1 --force-color-profile=srgb \
	  --hide-scrollbars --window-size=980,1400 --screenshot=raypack-demo/shot.png \
	  file://$(CURDIR)/raypack-demo/packed/report.html
	$(BIN)/python -c 'from PIL import Image; Image.open("raypack-demo/shot.png").convert("RGB").crop((0, 0, 980, 1200)).save("docs/report.png", optimize=True)'

clean:
	rm -rf $(VENV) $(MDS_VENV) .cache .pytest_cache .mypy_cache .ruff_cache .hypothesis raypack-demo
