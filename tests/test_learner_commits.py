"""The learner's commit bookkeeping (``learner.commits``): every completed step counts its groups
for admission, trained or not, and its entries are acked when ``learner.ack_policy`` says, on
every rank alike; rank 0's acks and counts reach Redis."""

from __future__ import annotations

import uuid

import pytest
import redis
from broker_helpers import make_group

from streamrl.broker.keys import Keys
from streamrl.learner.commits import Commits, StreamProgress
from streamrl.learner.grpo import rollout_io
from tests.learner_rollouts import xadd_groups

VOCAB = 64
STEP = [("1-0", "g1"), ("2-0", "g2"), ("3-0", "g3")]
EMPTY_STEP = [("4-0", "g4"), ("5-0", "g5")]


def test_a_step_is_counted_whether_or_not_it_trained_and_its_entries_wait_for_the_checkpoint():
    commits = Commits(StreamProgress(), "checkpoint")
    assert commits.count_with(len(STEP)) == 3 and not commits.pending
    commits.step_done(STEP, trained=True)
    commits.step_done(EMPTY_STEP, trained=False)
    assert commits.progress.consumed == 5 and commits.progress.unacked == STEP + EMPTY_STEP
    assert commits.pending and commits.count_with(2) == 7
    commits.checkpointed()
    assert commits.progress.unacked == [] and not commits.pending
    assert commits.progress.consumed == 5


def test_under_ack_policy_step_no_entry_waits_for_a_checkpoint():
    commits = Commits(StreamProgress(), "step")
    commits.step_done(STEP, trained=True)
    assert not commits.pending and commits.progress.consumed == 3


def _config(redis_cfg, ack_policy: str):
    return redis_cfg.model_copy(
        deep=True,
        update={
            "learner": redis_cfg.learner.model_copy(
                update={"groups_per_step": 2, "ack_policy": ack_policy}
            ),
            "rollout": redis_cfg.rollout.model_copy(update={"group_size": 2}),
            "weightsync": redis_cfg.weightsync.model_copy(update={"transport": "none"}),
        },
    )


class _Redis:
    """What the run's Redis holds: entries pending on the learner, admission's consumed count."""

    def __init__(self, cfg):
        self.cfg, self.keys = cfg, Keys.from_config(cfg.run, cfg.broker)
        self.client = redis.Redis.from_url(cfg.broker.redis_url)

    def pending(self) -> int:
        return self.client.xpending(self.keys.stream, self.cfg.broker.consumer_group)["pending"]

    def consumed(self) -> int:
        return int(self.client.get(self.keys.consumed) or 0)


@pytest.fixture
def rank0(redis_cfg, request):
    """Rank 0's RolloutIO on a stream of two groups (one step), and a view of Redis."""
    cfg = _config(redis_cfg, request.param)
    xadd_groups(cfg, [make_group(uuid.uuid4().hex), make_group(uuid.uuid4().hex)])
    io = rollout_io(cfg, VOCAB)
    yield io, _Redis(cfg)
    io.close()


@pytest.mark.parametrize("rank0", ["step"], indirect=True)
def test_ack_policy_step_acks_a_completed_step_with_its_count_at_once(rank0):
    io, held = rank0
    batch = io.next_batch(0, lambda: False)
    assert held.pending() == 2
    io.commits.step_done(batch.entries, trained=True)
    assert held.pending() == 0 and held.consumed() == 2


@pytest.mark.parametrize("rank0", ["checkpoint"], indirect=True)
def test_ack_policy_checkpoint_counts_an_untrained_step_at_once_and_acks_at_the_checkpoint(rank0):
    io, held = rank0
    batch = io.next_batch(0, lambda: False)
    io.commits.step_done(batch.entries, trained=False)
    assert held.pending() == 2 and held.consumed() == 2
    io.commits.checkpointed()
    assert held.pending() == 0 and held.consumed() == 2


@pytest.mark.parametrize("rank0", ["checkpoint"], indirect=True)
def test_a_restarted_learner_acks_what_its_checkpoint_lists_and_announces_its_count(rank0):
    io, held = rank0
    batch = io.next_batch(0, lambda: False)
    io.close()
    # the checkpoint of the step holds its entries, unacked: the learner died before acking
    restored = StreamProgress(step=1, consumed=2, unacked=list(batch.entries))
    successor = rollout_io(held.cfg, VOCAB, restored)
    try:
        successor.commits.resume()
        assert held.pending() == 0 and held.consumed() == 2
        assert restored.unacked == [] and restored.redis_epoch == successor.redis_epoch()
    finally:
        successor.close()


@pytest.mark.parametrize("rank0", ["checkpoint"], indirect=True)
def test_a_count_saved_under_another_redis_data_set_is_void(rank0):
    io, held = rank0
    io.close()
    restored = StreamProgress(step=3, consumed=6, redis_epoch="a-wiped-redis")
    successor = rollout_io(held.cfg, VOCAB, restored)
    try:
        successor.commits.resume()
        assert restored.consumed == 0 and held.consumed() == 0
    finally:
        successor.close()
