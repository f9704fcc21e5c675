"""Small builders shared by the broker tests."""

from __future__ import annotations

import zlib

import numpy as np

from streamrl.broker.semantics import Limits
from streamrl.broker.wire import Completion, RolloutGroup

VOCAB = 50


def make_group(
    group_id: str, n_completions: int = 2, length: int = 4, version: int = 0
) -> RolloutGroup:
    rng = np.random.default_rng(zlib.crc32(group_id.encode()))
    comps = [
        Completion(
            rng.integers(0, VOCAB, length).astype(np.int32),
            -rng.random(length).astype(np.float32),
            np.full(length, version, np.int32),
            float(rng.random()),
        )
        for _ in range(n_completions)
    ]
    return RolloutGroup(group_id, f"p-{group_id}", "a0", 0, np.array([1, 2, 3], np.int32), comps)


def limits_of(cfg) -> Limits:
    """The consumer's limits for a run of ``cfg``, as the learner takes them."""
    return Limits.from_config(
        cfg.rollout, cfg.broker, cfg.algo, cfg.completion_limit, cfg.reward_ranges
    )
