# streamrl: the two commands are `make run` and `make test`; both bootstrap the venv.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.streamrl-installed

CONFIG ?= configs/demo_cpu.yaml
ACTORS ?= 2
ARGS ?=
N ?= 1
ROUNDS ?= 20
PYTEST_ARGS ?=

# One torch thread per process: two threads on two cores ran 35x slower here (FACTS.md).
export OMP_NUM_THREADS ?= 1
export MKL_NUM_THREADS ?= 1
export DS_ACCELERATOR ?= cpu
export TOKENIZERS_PARALLELISM ?= false
export HF_HUB_OFFLINE ?= 1
export PYTHONUNBUFFERED := 1

.PHONY: run test lint mutate bench chaos broker actors scale dashboard prometheus clean venv

venv: $(STAMP)

# torch first, pinned to the CPU wheel on this disk, so nothing pulls a multi-GB CUDA build.
$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	touch $@

run: $(STAMP)
	$(BIN)/python -m launch --config $(CONFIG) --actors $(ACTORS) $(ARGS)

# The whole-system tests (several processes each, timing-sensitive on 2 cores) run in a pytest
# process of their own, after the rest, so nothing an earlier test left in the runner's process
# competes with them.
SYSTEM_TESTS := tests/test_end_to_end.py tests/test_chaos.py

test: $(STAMP) prometheus
	$(BIN)/python -m pytest -q -ra $(addprefix --ignore=,$(SYSTEM_TESTS)) $(PYTEST_ARGS)
	$(BIN)/python -m pytest -q -ra $(SYSTEM_TESTS) $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Mutation testing (mutmut, settings and test files in pyproject's [tool.mutmut]): mutates
# learner/ and broker/, runs the mutants of MUTATE (dotted module name, glob allowed), then prints
# every mutant not killed and the count per status. `$(BIN)/mutmut show NAME` shows one mutant's diff.
# Also: MUTATE="broker.admission*" or MUTATE="broker.wire*".
MUTATE ?= learner.algorithm*
mutate: $(STAMP)
	$(BIN)/mutmut run --max-children 2 "$(MUTATE)"
	$(BIN)/mutmut results --all true | grep -F "$(subst *,,$(MUTATE))" | sed 's/^ *//' | awk -F': ' '{n[$$2]++; if ($$2 != "killed") print} END {for (s in n) printf "%s: %d\n", s, n[s]}'

bench: $(STAMP)
	$(BIN)/python -m bench

chaos: $(STAMP)
	$(BIN)/python -m bench.chaos --rounds $(ROUNDS)

broker: $(STAMP)
	$(BIN)/python -m broker --config $(CONFIG) $(ARGS)

# Add N actors to a running `make run` (they find Redis through the run directory).
actors: $(STAMP)
	$(BIN)/python -m actors --config $(CONFIG) --count $(N) $(ARGS)

# Change the number of supervised actors of a running `make run`.
scale: $(STAMP)
	$(BIN)/python -m launch.scale --config $(CONFIG) --actors $(ACTORS) $(ARGS)

dashboard: $(STAMP) prometheus
	$(BIN)/python -m launch.dashboard --config $(CONFIG) $(ARGS)

# Debian's Prometheus (server + promtool) for `make dashboard` and the dashboard tests, and Debian's
# Chromium, in which the tests render the live view headless; installed once.
prometheus:
	@command -v prometheus >/dev/null && command -v chromium >/dev/null || { $(if $(filter 0,$(shell id -u)),,sudo) env DEBIAN_FRONTEND=noninteractive sh -c 'apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus chromium'; }

clean:
	rm -rf $(VENV) runs build *.egg-info .pytest_cache .ruff_cache .hypothesis mutants
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
