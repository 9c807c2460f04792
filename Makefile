# Two commands on a fresh machine:  `make run` (set up + default job)  and  `make test` (set up + tests).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup run test lint bench clean

# The venv, torch (CPU build pinned for machines without GPUs, unless a torch is already in the venv),
# then the project itself, editable, with its dev tools.
$(STAMP): pyproject.toml requirements/torch-cpu.txt
	@# tests' system parts, installed when missing (root + apt): `ip netns` hosts for the multi-node tests
	@# (iproute2) and headless Chromium for the report's browser test
	for need in ip:iproute2 chromium:chromium; do command -v $${need%%:*} >/dev/null || { \
		[ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && { apt-get update -qq; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $${need#*:} >/dev/null; }; } || \
		echo "no $${need#*:}: the tests that need it will skip"; done
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q -r requirements/torch-cpu.txt
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

run: setup
	$(BIN)/disttrain run $(ARGS)

lint: setup
	$(BIN)/ruff check src tests benchmarks examples scripts
	$(BIN)/ruff format --check src tests benchmarks examples scripts
	$(BIN)/mypy

test: lint
	$(BIN)/pytest $(PYTEST_ARGS)

bench: setup
	for b in benchmarks/bench_*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache .mypy_cache
