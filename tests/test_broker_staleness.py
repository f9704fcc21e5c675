"""The one staleness test: a token is stale once the learner has published more than
``max_staleness`` versions since the policy that sampled it, the same on ints, numpy arrays and
torch tensors, and the same test admission, the learner's batches and its loss apply."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

from streamrl.broker.admission import Bounds, slots
from streamrl.broker.semantics import is_stale
from streamrl.learner.batching import Sample
from streamrl.learner.step import counted_tokens

versions = st.integers(0, 60)
bounds = st.integers(0, 12)


def published_since(token_version: int, learner_version: int) -> list[int]:
    """The versions the learner published after the token's policy, up to its own."""
    return list(range(token_version + 1, learner_version + 1))


@given(learner=versions, token=versions, max_staleness=bounds)
def test_a_token_is_stale_when_more_than_max_staleness_versions_were_published_since_it(
    learner, token, max_staleness
):
    expected = len(published_since(token, learner)) > max_staleness
    assert is_stale(learner, token, max_staleness) == expected


@given(learner=versions, tokens=st.lists(versions, min_size=1, max_size=12), max_staleness=bounds)
def test_arrays_and_tensors_are_tested_token_by_token_as_ints_are(learner, tokens, max_staleness):
    one_by_one = [is_stale(learner, t, max_staleness) for t in tokens]
    # int32 is the wire's dtype for token versions, int64 the learner's
    assert is_stale(learner, np.array(tokens, np.int32), max_staleness).tolist() == one_by_one
    assert is_stale(learner, torch.tensor(tokens), max_staleness).tolist() == one_by_one
    assert is_stale(torch.tensor(learner), torch.tensor(tokens), max_staleness).tolist() == (
        one_by_one
    )


@given(
    engine=versions,
    learner=versions,
    max_staleness=bounds,
    per_batch=st.integers(1, 4),
    groups=st.integers(1, 8),
)
def test_admission_gives_no_slot_exactly_to_an_engine_whose_tokens_are_already_stale(
    engine, learner, max_staleness, per_batch, groups
):
    limit = Bounds(max_staleness, versions_per_batch=per_batch, groups_per_step=groups)
    assert (slots(engine, learner, limit) == 0) == is_stale(learner, engine, max_staleness)


def _sample(token_versions: list[int]) -> Sample:
    n = len(token_versions)
    return Sample(
        input_ids=np.arange(n + 2, dtype=np.int64),
        prompt_len=2,
        behaviour_logprobs=np.zeros(n, np.float32),
        versions=np.array(token_versions, np.int64),
        advantage=1.0,
        reward=1.0,
        group_id="g",
    )


@given(
    learner=versions,
    samples=st.lists(st.lists(versions, min_size=0, max_size=6), max_size=6),
    max_staleness=bounds,
)
def test_the_loss_normaliser_counts_the_tokens_and_sequences_that_are_not_stale(
    learner, samples, max_staleness
):
    fresh = [[v for v in s if not is_stale(learner, v, max_staleness)] for s in samples]
    expected = (sum(len(f) for f in fresh), sum(bool(f) for f in fresh))
    assert counted_tokens([_sample(s) for s in samples], learner, max_staleness) == expected


def test_the_constant_normaliser_scales_the_completion_budget_a_multi_turn_run_gives_it():
    from streamrl.configs.schema import AlgoConfig, RolloutConfig
    from streamrl.learner.step import loss_normalizer

    algo, rollout = AlgoConfig(aggregation="constant"), RolloutConfig(max_new_tokens=8)
    samples = [_sample([0, 0, 0]) for _ in range(3)]
    assert loss_normalizer(algo, rollout, samples, 0) == 8 * 3
    # a trajectory of several turns may hold env.max_total_tokens, not one turn's budget
    assert loss_normalizer(algo, rollout, samples, 0, completion_budget=32) == 32 * 3
    fixed = AlgoConfig(aggregation="constant", constant_normalizer=100)
    assert loss_normalizer(fixed, rollout, samples, 0, completion_budget=32) == 100
