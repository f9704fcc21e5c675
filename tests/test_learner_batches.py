"""Which stream entries make one learner step: fixed batches, and dynamic sampling (DAPO)."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from streamrl.broker.keys import Keys
from streamrl.broker.wire import Completion, RolloutGroup
from streamrl.learner.grpo import rollout_io
from streamrl.learner.prepare import dynamic_batch_size, has_signal, prepare_batch
from streamrl.learner.rollout_io import NoBatch
from tests.learner_rollouts import xadd_groups

VOCAB = 64


def group(rewards: list[float], version: int = 0) -> RolloutGroup:
    completions = [
        Completion(
            token_ids=np.array([5, 6], np.int32),
            logprobs=np.array([-0.5, -0.7], np.float32),
            versions=np.full(2, version, np.int32),
            reward=r,
        )
        for r in rewards
    ]
    return RolloutGroup(
        group_id=uuid.uuid4().hex,
        prompt_id="p",
        actor_id="a0",
        seq=0,
        prompt_token_ids=np.array([7, 8, 9], np.int32),
        completions=completions,
    )


def reference_batch_size(signal: list[bool], need: int, cap: int) -> int | None:
    """Grow the batch one group at a time until it holds ``need`` signal groups or ``max(cap, need)`` groups."""
    cap = max(cap, need)
    for size in range(1, len(signal) + 1):
        if sum(signal[:size]) == need or size == cap:
            return size
    return None


@given(
    signal=st.lists(st.booleans(), max_size=40),
    need=st.integers(1, 8),
    cap=st.integers(0, 30),
)
def test_dynamic_batch_size_matches_the_one_group_at_a_time_reference(signal, need, cap):
    assert dynamic_batch_size(signal, need, cap) == reference_batch_size(signal, need, cap)


def test_signal_means_trainable_neither_zero_variance_nor_wholly_stale(redis_cfg):
    cfg = redis_cfg.model_copy(deep=True)
    cfg.algo.max_staleness = 1
    assert has_signal(group([0.0, 1.0]), version=1, algo=cfg.algo)
    assert not has_signal(group([0.5, 0.5]), version=1, algo=cfg.algo)
    assert not has_signal(group([0.0, 1.0], version=0), version=2, algo=cfg.algo)


def _config(redis_cfg, **algo):
    return redis_cfg.model_copy(
        deep=True,
        update={
            "learner": redis_cfg.learner.model_copy(update={"groups_per_step": 3}),
            # the consumer dead-letters groups of another size (broker.semantics)
            "rollout": redis_cfg.rollout.model_copy(update={"group_size": 2}),
            "algo": redis_cfg.algo.model_copy(update=algo),
            "weightsync": redis_cfg.weightsync.model_copy(update={"transport": "none"}),
        },
    )


def _never() -> bool:
    return False


@pytest.fixture
def open_io():
    """RolloutIOs that are closed (Redis clients, publisher) after the test."""
    made = []

    def make(cfg):
        made.append(rollout_io(cfg, VOCAB))
        return made[-1]

    yield make
    for io in made:
        io.close()


def test_fixed_batches_take_groups_per_step_entries_and_keep_zero_variance_for_the_normaliser(
    redis_cfg, open_io
):
    cfg = _config(redis_cfg)
    groups = [group([0.2, 0.2]), group([0.0, 1.0]), group([0.3, 0.3]), group([0.0, 0.5])]
    xadd_groups(cfg, groups)
    batch = open_io(cfg).next_batch(0, _never)
    assert [g for _, g in batch.entries] == [g.group_id for g in groups[:3]]
    assert batch.log["zero_variance_groups"] == 2
    assert len(batch.samples) == 2 and len(batch.skipped) == 4


def test_dynamic_sampling_reads_on_until_the_step_has_enough_groups_with_a_signal(
    redis_cfg, open_io
):
    cfg = _config(redis_cfg, dynamic_sampling=True)
    flat = [group([0.5] * 2) for _ in range(4)]
    useful = [group([0.0, 1.0]) for _ in range(3)]
    groups = [flat[0], useful[0], flat[1], flat[2], useful[1], flat[3], useful[2], group([0, 1])]
    xadd_groups(cfg, groups)
    io = open_io(cfg)
    batch = io.next_batch(0, _never)
    # the shortest stream prefix holding 3 useful groups; the flat ones are acked with the step
    assert [g for _, g in batch.entries] == [g.group_id for g in groups[:7]]
    assert {s.group_id for s in batch.samples} == {g.group_id for g in useful}
    assert batch.log["zero_variance_groups"] == 4
    # left out of the loss normaliser
    assert batch.skipped == []
    # what was read past the step waits for the next one
    assert [d.group.group_id for d in io.buffer] == [groups[7].group_id]


def test_dynamic_sampling_stops_at_its_cap_when_the_policy_has_collapsed(redis_cfg, open_io):
    cfg = _config(redis_cfg, dynamic_sampling=True, dynamic_sampling_max_groups=5)
    groups = [group([0.5] * 2) for _ in range(5)] + [group([0.0, 1.0])]
    xadd_groups(cfg, groups)
    batch = open_io(cfg).next_batch(0, _never)
    assert len(batch.entries) == 5 and batch.samples == []
    assert batch.log["zero_variance_groups"] == 5


@pytest.mark.parametrize("dynamic", [False, True])
def test_prepare_batch_counts_stale_groups_apart_from_zero_variance_ones(redis_cfg, dynamic):
    cfg = _config(redis_cfg, dynamic_sampling=dynamic, max_staleness=1)

    class Delivery:
        def __init__(self, g):
            self.group, self.entry_id = g, "0-1"

    batch = prepare_batch(
        [Delivery(group([0.0, 1.0], version=0)), Delivery(group([1.0, 1.0], version=3))],
        version=3,
        algo=cfg.algo,
        wait_s=0.0,
    )
    assert batch.log["dropped_stale_groups"] == 1 and batch.log["zero_variance_groups"] == 1
    assert batch.samples == [] and len(batch.skipped) == (0 if dynamic else 2)


@pytest.mark.parametrize("term", ["kl_coef", "entropy_coef"])
def test_zero_variance_groups_are_trained_while_a_kl_or_entropy_term_gives_them_a_gradient(
    redis_cfg, term
):
    """Skipping a zero-advantage group is free only when its tokens have no other loss term."""
    cfg = _config(redis_cfg, skip_zero_variance=True, **{term: 0.1})

    class Delivery:
        def __init__(self, g):
            self.group, self.entry_id = g, "0-1"

    batch = prepare_batch(
        [Delivery(group([0.0, 1.0])), Delivery(group([1.0, 1.0]))],
        version=0,
        algo=cfg.algo,
        wait_s=0.0,
    )
    assert len(batch.samples) == 4 and batch.skipped == []
    assert batch.log["zero_variance_groups"] == 0


def test_a_step_still_short_of_data_reports_idle_and_keeps_what_it_read(
    redis_cfg, open_io, monkeypatch
):
    from streamrl.learner import rollout_io

    monkeypatch.setattr(rollout_io, "IDLE_BROADCAST_S", 0.3)
    cfg = _config(redis_cfg)
    cfg.broker.block_ms = 100
    first = group([0.0, 1.0])
    xadd_groups(cfg, [first])
    io = open_io(cfg)
    assert io.next_batch(0, _never) is NoBatch.IDLE
    assert [d.group.group_id for d in io.buffer] == [first.group_id]
    xadd_groups(cfg, [group([0.0, 1.0]), group([1.0, 0.0])])
    batch = io.next_batch(0, _never)
    assert batch.entries[0][1] == first.group_id and len(batch.entries) == 3


def test_groups_read_past_the_step_and_never_trained_are_redelivered_to_the_next_learner(
    redis_cfg, open_io
):
    """Dynamic sampling reads past the step; the learner dies before training what it read."""
    cfg = _config(redis_cfg, dynamic_sampling=True)
    u = [group([0.0, 1.0]) for _ in range(6)]
    groups = [u[0], group([0.5, 0.5]), u[1], u[2], u[3], u[4], u[5]]
    xadd_groups(cfg, groups)
    io = open_io(cfg)
    first = io.next_batch(0, _never)
    # two reads of 3: the first four hold 3 groups with a signal, the next two wait in the buffer
    assert [g for _, g in first.entries] == [g.group_id for g in groups[:4]]
    assert [d.group.group_id for d in io.buffer] == [u[3].group_id, u[4].group_id]
    io.ack(first.entries, consumed=4, step=1)
    keys = Keys.from_config(cfg.run, cfg.broker)
    client = redis.Redis.from_url(cfg.broker.redis_url)
    assert client.xpending(keys.stream, cfg.broker.consumer_group)["pending"] == 2
    # the learner dies here; its successor (same consumer name) re-reads its pending list first
    io.close()
    again = open_io(cfg).next_batch(0, _never)
    assert [g for _, g in again.entries] == [g.group_id for g in groups[4:]]
    assert client.xlen(keys.stream) == 3


def test_the_batch_reports_trls_reward_std_and_completion_figures(redis_cfg):
    """Rewards {0, 1} and {1, 1, 1}: sample stds 0.7071... and 0, TRL's reward_std their mean.
    Lengths 2, 2 and 4, 1, 1 tokens; one completion stopped at the token budget of the five."""
    cfg = _config(redis_cfg, dynamic_sampling=False, max_staleness=1)

    class Delivery:
        def __init__(self, g):
            self.group, self.entry_id = g, "0-1"

    second = group([1.0, 1.0, 1.0])
    second.completions[0].token_ids = np.array([1, 2, 3, 4], np.int32)
    second.completions[0].finish_reason = "length"
    for c in second.completions[1:]:
        c.token_ids = np.array([1], np.int32)
    for c in second.completions:
        c.logprobs = np.zeros(len(c.token_ids), np.float32)
        c.versions = np.zeros(len(c.token_ids), np.int32)
    batch = prepare_batch(
        [Delivery(group([0.0, 1.0])), Delivery(second)], version=0, algo=cfg.algo, wait_s=0.0
    )
    assert batch.log["reward_std"] == pytest.approx((0.5**0.5 + 0.0) / 2, rel=1e-15)
    assert batch.log["completions"] == {
        "mean_length": 2.0,
        "min_length": 1.0,
        "max_length": 4.0,
        "clipped_ratio": 0.2,
    }
