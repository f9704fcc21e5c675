"""One optimizer step's figures: summed over micro-batches into ``UpdateSums``, reduced over ranks as
one tensor, reported as the loss, the token count and per-token means."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from streamrl.learner.algorithm import LossStats
from streamrl.learner.step import UpdateSums, _all_reduce_sum, off_policy

# dyadic values: every sum below is exact, whatever the order
exact = st.integers(-64, 64).map(lambda k: k / 8)
FIELDS = len(dataclasses.fields(UpdateSums))


def _micro_batch(
    tokens: int,
    clipped: int,
    weight: float,
    truncated: int,
    kl: float,
    ent: float,
    weight_sq: float = 1.0,
    drift: float = 0.0,
):
    """The LossStats of a micro-batch of ``tokens`` tokens, ``clipped``/``truncated`` of them so."""
    return LossStats(
        tokens=tokens,
        clip_fraction=clipped / tokens,
        is_weight_mean=weight,
        is_truncated_fraction=truncated / tokens,
        kl=kl,
        entropy=ent,
        is_weight_sq_mean=weight_sq,
        behaviour_kl=drift,
    )


@given(values=st.lists(exact, min_size=FIELDS, max_size=FIELDS))
def test_the_sums_cross_the_wire_as_one_float64_tensor_and_come_back_field_for_field(values):
    sums = UpdateSums(*values)
    wire = sums.to_tensor()
    assert wire.dtype == torch.float64 and wire.shape == (len(dataclasses.fields(UpdateSums)),)
    assert UpdateSums.from_tensor(wire) == sums


def test_the_steps_figures_are_per_token_means_over_all_its_micro_batches():
    """Micro-batch A: 4 tokens, 1 clipped, IS weights averaging 0.5, 2 truncated, KL 0.25, entropy 1.
    Micro-batch B: 4 tokens, 3 clipped, weights averaging 1.5, 0 truncated, KL 0.75, entropy 2.
    Over the 8 tokens: clipped 4/8, weight (2 + 6)/8 = 1, truncated 2/8, KL (1 + 3)/8 = 0.5,
    entropy (4 + 8)/8 = 1.5; the loss is the sum of the micro-batches' (already normalised)."""
    sums = UpdateSums()
    sums.add(-0.25, _micro_batch(4, 1, 0.5, 2, 0.25, 1.0))
    sums.add(0.5, _micro_batch(4, 3, 1.5, 0, 0.75, 2.0))
    stats = sums.stats(grad_norm=2.0, forward_backward_s=0.1, optimizer_s=0.2)
    assert (stats.loss, stats.tokens) == (0.25, 8)
    assert (stats.clip_fraction, stats.is_weight_mean, stats.is_truncated_fraction) == (
        0.5,
        1.0,
        0.25,
    )
    assert (stats.kl, stats.entropy, stats.grad_norm) == (0.5, 1.5, 2.0)


def test_a_step_without_a_counted_token_reports_zero_means():
    stats = UpdateSums().stats(grad_norm=0.0, forward_backward_s=0.0, optimizer_s=0.0)
    assert (stats.tokens, stats.clip_fraction, stats.kl, stats.entropy) == (0, 0.0, 0.0, 0.0)


@given(
    mine=st.lists(exact, min_size=FIELDS, max_size=FIELDS),
    theirs=st.lists(exact, min_size=FIELDS, max_size=FIELDS),
)
def test_summing_the_ranks_tensors_equals_one_rank_adding_every_micro_batch(mine, theirs):
    """The all-reduce adds the wire tensors; two ranks' sums then read as one rank's of both."""
    one_rank = UpdateSums(*(a + b for a, b in zip(mine, theirs, strict=True)))
    wire = UpdateSums(*mine).to_tensor() + UpdateSums(*theirs).to_tensor()
    assert UpdateSums.from_tensor(wire) == one_rank


def test_a_world_of_one_reduces_to_its_own_sums():
    sums = UpdateSums(0.5, 8.0, 4.0, 8.0, 2.0, 4.0, 12.0)
    assert _all_reduce_sum(sums) == sums


def _weights(values: list[float]) -> tuple[float, float]:
    return sum(values) / len(values), sum(v * v for v in values) / len(values)


def test_the_ess_and_the_drift_are_those_of_all_the_first_passs_tokens_together():
    """Weights {0, 1, 0, 1} in micro-batch A and {1, 2, 1, 2} in B: over the 8 tokens mean 1 and
    mean square 12/8, an ESS of 2/3 (neither micro-batch's own: 1/2 and 9/10). A second pass over
    the same tokens (epoch 1) changes nothing: the figures describe the data, not the updates."""
    a_w, a_sq = _weights([0, 1, 0, 1])
    b_w, b_sq = _weights([1, 2, 1, 2])
    first = UpdateSums()
    first.add(0.0, _micro_batch(4, 0, a_w, 0, 0.0, 0.0, a_sq, 0.25))
    first.add(0.0, _micro_batch(4, 0, b_w, 0, 0.0, 0.0, b_sq, 0.75))
    again = UpdateSums()
    again.add(0.0, _micro_batch(4, 0, 1.0, 0, 0.0, 0.0, 1.0, 5.0))
    first_stats = first.stats(grad_norm=0.0, forward_backward_s=0.0, optimizer_s=0.0)
    second_stats = dataclasses.replace(
        again.stats(grad_norm=0.0, forward_backward_s=0.0, optimizer_s=0.0), epoch=1
    )
    figures = off_policy([first_stats, second_stats])
    assert figures["is_ess"] == pytest.approx(2 / 3, rel=1e-15)
    assert figures["behaviour_kl"] == 0.5
    assert math.isnan(off_policy([])["is_ess"])
