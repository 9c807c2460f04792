# Two commands on a fresh machine:  `make run` (set up + default job)  and  `make test` (set up + tests).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
RUN_STAMP  := $(VENV)/.installed-run
TEST_STAMP := $(VENV)/.installed-test

.PHONY: setup run test test-quick lint bench bench-quick clean

# What the default job needs: the venv, torch (CPU build pinned for machines without GPUs, unless a torch is
# already in the venv), then the project itself, editable.
$(RUN_STAMP): pyproject.toml requirements/torch-cpu.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q -r requirements/torch-cpu.txt
	$(BIN)/python -m pip install -q -e .
	touch $@

# What the tests add: the dev tools and extras (pytest, ruff, mypy, gymnasium, transformers, ...), and the
# tests' system parts, installed when missing (root + apt): `ip netns` hosts for the multi-node tests
# (iproute2) and headless Chromium for the report's browser test.
$(TEST_STAMP): $(RUN_STAMP)
	for need in ip:iproute2 chromium:chromium; do command -v $${need%%:*} >/dev/null || { \
		[ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && { apt-get update -qq; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $${need#*:} >/dev/null; }; } || \
		echo "no $${need#*:}: the tests that need it will skip"; done
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

setup: $(RUN_STAMP)

run: setup
	$(BIN)/disttrain run $(ARGS)

lint: $(TEST_STAMP)
	$(BIN)/ruff check src tests benchmarks examples scripts
	$(BIN)/ruff format --check src tests benchmarks examples scripts
	$(BIN)/mypy

# The whole suite (what CI runs), then seconds per test file, slowest first: a slower suite shows which file grew.
# Test files run side by side on TEST_WORKERS pytest-xdist workers (one per core, at most 4). --dist loadfile
# keeps a file's tests together on one worker, so its module fixtures (one launch for many scenarios) run once
# (pytest 9 ignores the nodeid rewrite behind --dist loadgroup, which then spreads a file's tests over workers and
# runs its fixtures on each); TEST_WORKERS=0 runs them in this process, one after another.
RESULTS := .test-results.xml
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; echo $$n)
XDIST = -n $(TEST_WORKERS) --dist loadfile
test: lint
	$(BIN)/pytest $(XDIST) --junitxml=$(RESULTS) $(PYTEST_ARGS); status=$$?; \
	$(BIN)/python scripts/test_tables.py files $(RESULTS) --top 25; exit $$status

# The inner loop: unit and single-process tests, no lint (a few minutes); `make test` stays the full suite.
test-quick: $(TEST_STAMP)
	$(BIN)/pytest $(XDIST) -m "not slow" $(PYTEST_ARGS)

# The benchmarks are a package: each runs as a module from the repository root. `bench` is the full tier (the
# figures of docs/performance.md); `bench-quick` runs each with small options (--quick) to prove it still runs, in
# under 10 minutes on a quiet 2-core machine (its results: benchmarks/results/NAME_quick.json).
bench: $(TEST_STAMP)
	for b in benchmarks/bench_*.py; do $(BIN)/python -m benchmarks.$$(basename $$b .py) || exit 1; done

bench-quick: $(TEST_STAMP)
	for b in benchmarks/bench_*.py; do $(BIN)/python -m benchmarks.$$(basename $$b .py) --quick || exit 1; done

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache .mypy_cache
