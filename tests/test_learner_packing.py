"""A learner that pays for tokens, not padding: packed rows, and no entropy gradient unless its bonus is on.

The packed forward pass must give what the padded one gives (the demo's Qwen2 in float64),
and a mini-batch split into packed micro-batches must give the gradient of the whole mini-batch
as one padded batch, for every loss aggregation.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrl.configs.schema import AlgoConfig, LearnerConfig, RolloutConfig
from streamrl.learner import algorithm
from streamrl.learner.batching import (
    Sample,
    collate,
    pack_micro_batches,
    pack_rows,
    rank_micro_batches,
    row_width,
)
from streamrl.learner.engine import token_logprobs
from streamrl.learner.step import (
    _loss,
    _policy_logprobs,
    loss_normalizer,
    token_scorer,
)
from streamrl.policy.load import load_policy
from streamrl.policy.logprobs import sequence_logprobs

PAD = 0
# the learner's scorer at temperature 1, no truncation
SCORE = token_scorer(RolloutConfig(), LearnerConfig())
VERSION = 3


def reference_best_fit_decreasing(lengths: list[int]) -> list[list[int]]:
    """The obvious O(n * rows) best-fit decreasing: recount every row's load at every step."""
    width = row_width(max(lengths))
    rows: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        rooms = [width - sum(lengths[j] for j in row) for row in rows]
        fits = [r for r, room in enumerate(rooms) if room >= lengths[i]]
        if fits:
            rows[min(fits, key=lambda r: (rooms[r], r))].append(i)
        else:
            rows.append([i])
    return rows


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 100), min_size=1, max_size=60))
def test_rows_are_best_fit_decreasing_and_cost_about_the_real_tokens(lengths):
    rows = pack_rows(lengths)
    assert rows == reference_best_fit_decreasing(lengths)
    width, total = row_width(max(lengths)), sum(lengths)
    # best-fit decreasing uses at most 11/9 of the fewest rows possible, plus one
    assert len(rows) <= math.ceil(11 / 9 * math.ceil(total / width)) + 1


def _samples(lengths: list[int], prompt: int, seed: int) -> list[Sample]:
    rng = np.random.default_rng(seed)
    out = []
    for i, n in enumerate(lengths):
        c = n - prompt
        out.append(
            Sample(
                input_ids=rng.integers(4, 60, size=n),
                prompt_len=prompt,
                behaviour_logprobs=-rng.random(c).astype(np.float32) * 3,
                # a few tokens older than max_staleness: the mask and normaliser must skip them alike
                versions=np.where(rng.random(c) < 0.1, 0, VERSION).astype(np.int64),
                advantage=float(rng.normal()),
                reward=0.0,
                group_id=str(i // 4),
                ref_logprobs=-rng.random(c).astype(np.float32) * 3,
            )
        )
    return out


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(3, 90), min_size=1, max_size=25),
    budget=st.integers(1, 400),
    seed=st.integers(0, 2**16),
)
def test_packed_rows_hold_each_sample_at_its_own_positions_and_targets(lengths, budget, seed):
    samples = _samples(lengths, prompt=2, seed=seed)
    for part in pack_micro_batches(samples, budget):
        mb = collate(part, PAD, budget)
        width = row_width(mb.input_ids.shape[1], budget)
        assert mb.packed_ids.shape[1] == width and mb.packed_tokens == mb.packed_ids.numel()
        assert mb.sequence_tokens == sum(len(s) for s in part)
        real = mb.attention_mask.bool()
        # every token of every sample, and its position within its sample, found in the rows
        flat_ids = mb.packed_ids.flatten()
        flat_pos = mb.position_ids.flatten()
        # the packed target index names the input position before the target: +1 row-wise
        index = mb.packed_index + mb.packed_index // (width - 1) + 1
        targets = real[:, 1:]
        assert torch.equal(flat_ids[index][targets], mb.input_ids[:, 1:][targets])
        positions = torch.arange(mb.input_ids.shape[1]).expand_as(mb.input_ids)[:, 1:]
        assert torch.equal(flat_pos[index][targets], positions[targets])
        # a row holds samples end to end: never more rows than samples, and within the budget
        assert mb.packed_ids.shape[0] <= len(part)
        assert len(part) == 1 or mb.packed_tokens <= budget


@pytest.fixture(scope="module")
def model64(demo_policy):
    return load_policy(demo_policy).double()


def test_packed_log_probs_and_entropy_equal_the_padded_ones(model64):
    """Mixed lengths so that rows hold several samples; float64, so any cross-sample attention shows."""
    samples = _samples([5, 31, 7, 12, 3, 9, 9, 20, 4, 16, 6, 11], prompt=2, seed=1)
    mb = collate(samples, PAD)
    assert mb.packed_ids.shape[0] < len(samples)
    with torch.no_grad():
        packed, packed_entropy = token_logprobs(model64, mb, 0.7, with_entropy=True)
        padded, padded_entropy = sequence_logprobs(
            model64, mb.input_ids, mb.attention_mask, 0.7, with_entropy=True
        )
    real = mb.completion_mask
    assert_close(packed[real], padded[real], "log-probs")
    assert_close(packed_entropy[real], padded_entropy[real], "entropy")


def test_rows_run_end_to_end_as_one_row_give_the_same_log_probs(model64):
    """Flash attention keeps packed samples apart only in a batch of one row: the one-row layout
    (here under sdpa, which reads the same position ids) must give what the rows give."""
    mb = collate(_samples([5, 31, 7, 12, 3, 9, 9, 20, 4, 16, 6, 11, 70, 40], prompt=2, seed=6), PAD)
    assert mb.packed_ids.shape[0] > 1
    with torch.no_grad():
        rows, rows_entropy = token_logprobs(model64, mb, 0.7, with_entropy=True, one_row=False)
        one, one_entropy = token_logprobs(model64, mb, 0.7, with_entropy=True, one_row=True)
    real = mb.completion_mask
    assert_close(one[real], rows[real], "log-probs")
    assert_close(one_entropy[real], rows_entropy[real], "entropy")


def test_an_attention_that_cannot_keep_packed_samples_apart_is_refused(demo_policy):
    model = load_policy(demo_policy)
    model.config._attn_implementation = "paged|sdpa"
    with pytest.raises(ValueError, match="cannot keep packed samples apart"):
        token_logprobs(model, collate(_samples([9, 6], prompt=3, seed=7), PAD), 1.0)


def assert_close(ours: torch.Tensor, reference: torch.Tensor, name: str) -> None:
    """Equal up to float32 rounding: the model runs in float64 but Qwen2's RMSNorm computes in
    float32. A sample attending to its row neighbours, or a wrong normaliser, is off by percents."""
    scale = max(reference.abs().max().item(), 1e-3)
    diff = (ours - reference).abs().max().item()
    assert diff <= 1e-5 * scale, f"{name}: differs by {diff:.2e} (scale {scale:.2e})"


def _grads(model) -> dict[str, torch.Tensor]:
    out = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean", "constant"])
def test_packed_micro_batches_give_the_padded_mini_batchs_gradient(model64, aggregation):
    """The step's own path (token-budget packed micro-batches, each loss over the whole
    mini-batch's normaliser) against one padded batch of every sample, on a long-tail spread."""
    rng = np.random.default_rng(2)
    completions = np.minimum(rng.zipf(1.6, size=24), 24)
    samples = _samples([int(6 + c) for c in completions], prompt=6, seed=3)
    algo = AlgoConfig(
        aggregation=aggregation, kl_coef=0.05, entropy_coef=0.01, max_staleness=2, clip_low=0.1
    )
    rollout = RolloutConfig(max_new_tokens=24)
    normalizer = loss_normalizer(algo, rollout, samples, VERSION)

    batches, _real = rank_micro_batches(samples, 1, 0, 64, PAD, torch.device("cpu"))
    assert len(batches) > 2
    for mb in batches:
        logprobs, entropy = _policy_logprobs(model64, mb, SCORE, algo)
        loss, _ = _loss(algo, logprobs, entropy, mb, VERSION, None, mb.ref_logprobs, normalizer)
        loss.backward()
    packed = _grads(model64)

    whole = collate(samples, PAD)
    logprobs, entropy = sequence_logprobs(
        model64, whole.input_ids, whole.attention_mask, 1.0, with_entropy=True
    )
    loss, _ = _loss(algo, logprobs, entropy, whole, VERSION, None, whole.ref_logprobs, normalizer)
    loss.backward()
    padded = _grads(model64)

    assert set(packed) == set(padded)
    for name, grad in padded.items():
        assert_close(packed[name], grad, name)
    # the forward passes ran on about the real tokens, the padded batch on rows x the longest
    real = sum(len(s) for s in samples)
    assert sum(mb.sequence_tokens for mb in batches) == real
    assert sum(mb.packed_tokens for mb in batches) < 0.5 * whole.input_ids.numel()


def test_without_an_entropy_bonus_the_entropy_is_logged_outside_the_backward_graph(model64):
    """Coef 0: the entropy holds no autograd graph (no [B, L, vocabulary] activations kept for
    a backward that never uses them). Coef > 0: its gradient is in the step's, exactly
    -coef x the entropy term's."""
    mb = collate(_samples([9, 14, 5, 11], prompt=3, seed=4), PAD)
    algo_off = AlgoConfig(entropy_coef=0.0, max_staleness=2)
    logprobs, entropy = _policy_logprobs(model64, mb, SCORE, algo_off)
    assert logprobs.grad_fn is not None and entropy.grad_fn is None
    loss, stats = _loss(algo_off, logprobs, entropy, mb, VERSION, None, None, 1.0)
    assert math.isfinite(stats.entropy) and stats.entropy > 0
    loss.backward()
    off = _grads(model64)

    algo_on = AlgoConfig(entropy_coef=0.5, max_staleness=2)
    logprobs, entropy = _policy_logprobs(model64, mb, SCORE, algo_on)
    assert entropy.grad_fn is not None
    _loss(algo_on, logprobs, entropy, mb, VERSION, None, None, 1.0)[0].backward()
    on = _grads(model64)

    _, entropy = token_logprobs(model64, mb, 1.0, with_entropy=True)
    mask = mb.completion_mask & (mb.versions >= VERSION - algo_on.max_staleness)
    (-algo_on.entropy_coef * algorithm.aggregate(entropy, mask, "token_mean", 1.0)).backward()
    bonus = _grads(model64)
    assert any(g.abs().max() > 1e-6 for g in bonus.values())
    for name, grad in on.items():
        assert_close(grad, off[name] + bonus[name], name)


def test_an_entropy_bonus_on_an_entropy_without_gradient_is_refused(model64):
    mb = collate(_samples([9, 6], prompt=3, seed=5), PAD)
    logprobs, entropy = token_logprobs(model64, mb, 1.0, with_entropy=True, entropy_grad=False)
    with pytest.raises(ValueError, match="entropy_coef"):
        _loss(AlgoConfig(entropy_coef=0.1), logprobs, entropy, mb, VERSION, None, None, 1.0)
