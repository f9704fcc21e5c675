"""The RL math against slow, obvious references written as Python loops over plain floats."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrl.broker.semantics import is_stale
from streamrl.broker.wire import Completion, RolloutGroup
from streamrl.learner import algorithm
from streamrl.learner.batching import (
    Sample,
    collate,
    masked_out,
    pack_micro_batches,
    pack_rows,
    partition_across_ranks,
    plan_rank_micro_batches,
    row_width,
    samples_from_group,
)

SETTINGS = settings(max_examples=40, deadline=None)


def ref_advantages(rewards: list[float], mode: str, eps: float, threshold: float) -> list[float]:
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
    if mode == "drgrpo" or std < threshold:
        return [r - mean for r in rewards]
    return [(r - mean) / (std + eps) for r in rewards]


@SETTINGS
@given(
    rewards=st.lists(st.lists(st.floats(-5, 5), min_size=4, max_size=4), min_size=1, max_size=5),
    mode=st.sampled_from(["grpo", "drgrpo"]),
)
def test_group_advantages_match_reference(rewards, mode):
    adv, zero = algorithm.group_advantages(
        torch.tensor(rewards, dtype=torch.float64), mode, 1e-4, 1e-6
    )
    for i, group in enumerate(rewards):
        expected = ref_advantages(group, mode, 1e-4, 1e-6)
        assert adv[i].tolist() == pytest.approx(expected, rel=1e-9, abs=1e-9)
        assert bool(zero[i]) == (max(group) == min(group))


def test_all_equal_rewards_are_zero_variance_with_zero_advantage():
    adv, zero = algorithm.group_advantages(
        torch.tensor([[0.7] * 8, [0.0, 1.0] * 4]), "grpo", 1e-4, 1e-6
    )
    assert zero.tolist() == [True, False]
    assert adv[0].abs().max().item() == 0.0
    assert torch.isfinite(adv).all()


def test_tiny_std_falls_back_to_mean_subtraction():
    rewards = torch.tensor([[1.0, 1.0 + 1e-9, 1.0, 1.0]], dtype=torch.float64)
    adv, zero = algorithm.group_advantages(rewards, "grpo", 1e-4, 1e-6)
    assert not zero[0]
    assert adv[0].tolist() == pytest.approx(
        [r - rewards.mean().item() for r in rewards[0].tolist()], abs=1e-15
    )


def test_unknown_modes_are_refused():
    with pytest.raises(ValueError, match="advantage mode"):
        algorithm.group_advantages(torch.zeros(1, 2), "ppo", 1e-4, 1e-6)
    with pytest.raises(ValueError, match="aggregation"):
        algorithm.aggregate(torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool), "sum")
    with pytest.raises(ValueError, match="normalizer"):
        algorithm.aggregate(torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool), "constant")


def test_staleness_and_is_stale_and_tightening():
    versions = torch.tensor([[5, 4, 3, 0]])
    staleness = algorithm.token_staleness(5, versions)
    assert staleness.tolist() == [[0, 1, 2, 5]]
    assert is_stale(5, versions, 2).tolist() == [[False, False, False, True]]
    assert algorithm.tighten(0.2, staleness, 0.0).tolist()[0] == pytest.approx([0.2] * 4)
    assert algorithm.tighten(0.2, staleness, 0.25).tolist()[0] == pytest.approx(
        [0.2, 0.15, 0.1, 0.0]
    )
    assert algorithm.tighten(3.0, staleness, 0.5, floor=1.0).tolist()[0] == pytest.approx(
        [3.0, 2.0, 1.0, 1.0]
    )


def ref_loss(
    theta,
    mu,
    prox,
    adv,
    mask,
    clip_low,
    clip_high,
    rho,
    correction,
    ref,
    kl_coef,
    aggregation,
    constant,
    ent=None,
    ent_coef=0.0,
):
    """Per-token Python loop of the loss in docs/architecture.md."""
    per_seq, total, count = [], 0.0, 0
    stats = {"clip": 0, "w": 0.0, "w2": 0.0, "trunc": 0, "kl": 0.0, "entropy": 0.0, "drift": 0.0}
    for i in range(len(theta)):
        seq_total, seq_count = 0.0, 0
        for t in range(len(theta[i])):
            if not mask[i][t]:
                continue
            p = prox[i][t] if (correction and prox is not None) else mu[i][t]
            raw_w = math.exp(p - mu[i][t]) if correction else 1.0
            w = min(raw_w, rho) if correction else 1.0
            r = math.exp(theta[i][t] - p)
            a = adv[i]
            unclipped, clipped = r * a, min(max(r, 1 - clip_low), 1 + clip_high) * a
            loss = -w * min(unclipped, clipped)
            target = ref[i][t] if ref is not None else mu[i][t]
            k3 = math.exp(target - theta[i][t]) - (target - theta[i][t]) - 1
            if ref is not None:
                loss += kl_coef * k3
            if ent is not None:
                loss -= ent_coef * ent[i][t]
                stats["entropy"] += ent[i][t]
            stats["clip"] += unclipped > clipped
            stats["w"] += w
            stats["w2"] += w * w
            # KL(mu || pi_prox) on tokens sampled from mu, whenever pi_prox is known
            d = (prox[i][t] if prox is not None else mu[i][t]) - mu[i][t]
            stats["drift"] += math.exp(d) - d - 1
            stats["trunc"] += correction and raw_w > rho
            stats["kl"] += k3
            seq_total += loss
            seq_count += 1
        total += seq_total
        count += seq_count
        if seq_count:
            per_seq.append(seq_total / seq_count)
    if aggregation == "token_mean":
        value = total / max(count, 1)
    elif aggregation == "seq_mean":
        value = sum(per_seq) / max(len(per_seq), 1)
    else:
        value = total / constant
    n = max(count, 1)
    return value, {k: v / n for k, v in stats.items()}, count


@SETTINGS
@given(
    seed=st.integers(0, 10_000),
    rows=st.integers(1, 4),
    width=st.integers(1, 6),
    aggregation=st.sampled_from(["token_mean", "seq_mean", "constant"]),
    correction=st.booleans(),
    with_prox=st.booleans(),
    with_ref=st.booleans(),
    with_entropy=st.booleans(),
)
def test_policy_loss_matches_per_token_reference(
    seed, rows, width, aggregation, correction, with_prox, with_ref, with_entropy
):
    g = torch.Generator().manual_seed(seed)
    theta = -torch.rand(rows, width, generator=g, dtype=torch.float64) * 3
    mu = (theta + torch.randn(rows, width, generator=g, dtype=torch.float64) * 0.5).clamp(max=0)
    prox = (
        (theta + torch.randn(rows, width, generator=g, dtype=torch.float64) * 0.3)
        if with_prox
        else None
    )
    ref = (
        (theta + torch.randn(rows, width, generator=g, dtype=torch.float64) * 0.3)
        if with_ref
        else None
    )
    entropy = (
        torch.rand(rows, width, generator=g, dtype=torch.float64) * 2 if with_entropy else None
    )
    adv = torch.randn(rows, generator=g, dtype=torch.float64)
    mask = torch.rand(rows, width, generator=g) > 0.3
    kwargs = dict(clip_low=0.2, clip_high=0.28, rho_max=1.5)
    loss, stats = algorithm.policy_loss(
        theta, mu, adv, mask, proximal_logprobs=prox, importance_correction=correction,
        ref_logprobs=ref, kl_coef=0.1, entropy=entropy, entropy_coef=0.05,
        aggregation=aggregation, normalizer=7.0 if aggregation == "constant" else None, **kwargs,
    )  # fmt: skip
    lists = [x.tolist() if x is not None else None for x in (theta, mu, prox)]
    expected, ref_stats, count = ref_loss(
        *lists, adv.tolist(), mask.tolist(), 0.2, 0.28, 1.5, correction,
        ref.tolist() if ref is not None else None, 0.1, aggregation, 7.0,
        entropy.tolist() if entropy is not None else None, 0.05,
    )  # fmt: skip
    assert loss.item() == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert stats.tokens == count
    assert stats.clip_fraction == pytest.approx(ref_stats["clip"])
    assert stats.is_weight_mean == pytest.approx(ref_stats["w"])
    assert stats.is_truncated_fraction == pytest.approx(ref_stats["trunc"])
    assert stats.is_weight_sq_mean == pytest.approx(ref_stats["w2"])
    assert stats.behaviour_kl == pytest.approx(ref_stats["drift"], abs=1e-12)
    assert stats.kl == pytest.approx(ref_stats["kl"], abs=1e-12)
    if with_entropy:
        assert stats.entropy == pytest.approx(ref_stats["entropy"], abs=1e-12)
    else:
        assert math.isnan(stats.entropy)


def test_padding_and_stale_positions_never_contribute_even_when_infinite():
    theta = torch.tensor([[-0.5, -1.0, float("-inf")]], requires_grad=True)
    mu = torch.tensor([[-0.4, -1.2, 0.0]])
    mask = torch.tensor([[True, True, False]])
    loss, stats = algorithm.policy_loss(
        theta, mu, torch.tensor([1.0]), mask, clip_low=0.2, clip_high=0.2, rho_max=2.0
    )
    loss.backward()
    assert torch.isfinite(loss) and stats.tokens == 2
    assert theta.grad[0, 2].item() == 0.0 and theta.grad[0, :2].abs().sum() > 0


def test_all_tokens_stale_gives_zero_loss_and_zero_gradient():
    theta = torch.randn(2, 3).clamp(max=0).requires_grad_()
    mask = torch.zeros(2, 3, dtype=torch.bool)
    for aggregation in ("token_mean", "seq_mean"):
        loss, stats = algorithm.policy_loss(
            theta,
            theta.detach(),
            torch.ones(2),
            mask,
            clip_low=0.2,
            clip_high=0.2,
            rho_max=2.0,
            aggregation=aggregation,
        )
        loss.backward()
        assert loss.item() == 0.0 and stats.tokens == 0
        assert theta.grad.abs().sum().item() == 0.0


def test_length_one_completions_on_policy_gradient_is_minus_advantage_over_count():
    theta = torch.tensor([[-0.3], [-2.0]], requires_grad=True)
    adv = torch.tensor([1.0, -1.0])
    loss, _ = algorithm.policy_loss(
        theta,
        theta.detach(),
        adv,
        torch.ones(2, 1, dtype=torch.bool),
        clip_low=0.2,
        clip_high=0.2,
        rho_max=2.0,
    )
    loss.backward()
    # on-policy r = 1: d/dtheta (-r A) / N = -A / N
    assert theta.grad[:, 0].tolist() == pytest.approx([-0.5, 0.5])


def test_micro_batch_losses_with_batch_normalizer_add_up_to_the_batch_loss():
    g = torch.Generator().manual_seed(0)
    theta, mu = -torch.rand(6, 5, generator=g), -torch.rand(6, 5, generator=g)
    adv, mask = torch.randn(6, generator=g), torch.rand(6, 5, generator=g) > 0.2
    kw = dict(clip_low=0.2, clip_high=0.2, rho_max=2.0)
    for aggregation, norm in (
        ("token_mean", float(mask.sum())),
        ("seq_mean", float((mask.sum(-1) > 0).sum())),
    ):
        whole, _ = algorithm.policy_loss(theta, mu, adv, mask, aggregation=aggregation, **kw)
        parts = sum(
            algorithm.policy_loss(
                theta[s], mu[s], adv[s], mask[s], aggregation=aggregation, normalizer=norm, **kw
            )[0]
            for s in (slice(0, 2), slice(2, 3), slice(3, 6))
        )
        assert parts.item() == pytest.approx(whole.item(), rel=1e-6)


def _sample(length: int, prompt: int = 2, gid: str = "g") -> Sample:
    rng = np.random.default_rng(length)
    return Sample(
        input_ids=rng.integers(0, 50, length),
        prompt_len=prompt,
        behaviour_logprobs=-rng.random(length - prompt).astype(np.float32),
        versions=np.arange(length - prompt),
        advantage=0.5,
        reward=1.0,
        group_id=gid,
    )


@SETTINGS
@given(
    lengths=st.lists(st.integers(3, 40), min_size=1, max_size=30),
    world=st.integers(1, 4),
    budget=st.integers(1, 120),
)
def test_partition_and_packing_keep_every_sample_once_and_respect_the_budget(
    lengths, world, budget
):
    samples = [_sample(n, gid=str(i)) for i, n in enumerate(lengths)]
    shares = partition_across_ranks(samples, world)
    assert sorted(id(s) for share in shares for s in share) == sorted(id(s) for s in samples)
    loads = [sum(len(s) for s in share) for share in shares]
    # greedy longest-first bound
    assert max(loads) - min(loads) <= max(lengths)
    for share in shares:
        batches = pack_micro_batches(share, budget)
        assert sorted(id(s) for b in batches for s in b) == sorted(id(s) for s in share)
        for b in batches:
            lengths = [len(s) for s in b]
            packed = len(pack_rows(lengths, budget)) * row_width(max(lengths), budget)
            assert len(b) == 1 or packed <= budget
    plans = [plan_rank_micro_batches(samples, world, r, budget) for r in range(world)]
    planned = [id(s) for mine, _ in plans for batch in mine for s in batch]
    assert sorted(planned) == sorted(id(s) for s in samples)
    # every rank runs as many micro-batches as the busiest rank has (fillers make up the rest)
    assert [count for _, count in plans] == [max(len(mine) for mine, _ in plans)] * world


def test_collate_aligns_targets_with_completion_tokens_and_masks_padding():
    short, long = _sample(4, prompt=2), _sample(7, prompt=3)
    mb = collate([short, long], pad_id=99)
    assert mb.input_ids.shape == (2, 7) and mb.completion_mask.shape == (2, 6)
    assert (
        mb.input_ids[0, 4:].tolist() == [99, 99, 99]
        and mb.attention_mask[0].tolist() == [1] * 4 + [0] * 3
    )
    for row, s in enumerate((short, long)):
        positions = mb.completion_mask[row].nonzero().squeeze(-1)
        assert (mb.input_ids[row, positions + 1].numpy() == s.input_ids[s.prompt_len :]).all()
        assert mb.behaviour_logprobs[row, positions].tolist() == pytest.approx(
            s.behaviour_logprobs.tolist()
        )
        assert mb.versions[row, positions].tolist() == s.versions.tolist()
    assert mb.num_tokens == 2 + 4
    assert masked_out(mb).num_tokens == 0


def test_samples_from_group_carry_prompt_completion_and_advantage():
    group = RolloutGroup(
        group_id="g1", prompt_id="p", actor_id="a", seq=0,
        prompt_token_ids=np.array([5, 6], dtype=np.int32),
        completions=[
            Completion(np.array([7], dtype=np.int32), np.array([-0.1], dtype=np.float32), np.array([3], dtype=np.int32), 1.0),
            Completion(np.array([8, 9], dtype=np.int32), np.array([-0.2, -0.3], dtype=np.float32), np.array([3, 4], dtype=np.int32), 0.0),
        ],
    )  # fmt: skip
    samples = samples_from_group(group, [0.5, -0.5])
    assert [s.input_ids.tolist() for s in samples] == [[5, 6, 7], [5, 6, 8, 9]]
    assert [s.advantage for s in samples] == [0.5, -0.5] and samples[1].versions.tolist() == [3, 4]
    with pytest.raises(ValueError, match="advantages"):
        samples_from_group(group, [0.5])


def test_the_learner_step_takes_gspo_and_its_own_clip_range_from_the_config():
    from streamrl.configs.schema import AlgoConfig
    from streamrl.learner.step import _loss

    rng = np.random.default_rng(2)
    samples = [
        Sample(rng.integers(4, 30, 3 + n), 3, rng.normal(-1.0, 0.1, n).astype(np.float32),
               np.zeros(n, np.int64), adv, 0.0, "g")
        for n, adv in ((4, 1.0), (2, -0.5), (5, 0.8))
    ]  # fmt: skip
    mb = collate(samples, pad_id=0)
    theta = mb.behaviour_logprobs + torch.from_numpy(
        rng.normal(0, 0.3, mb.behaviour_logprobs.shape)
    )
    theta = theta.to(mb.behaviour_logprobs.dtype)
    mask = mb.completion_mask

    def by_hand(level, low, high):
        return algorithm.policy_loss(
            theta, mb.behaviour_logprobs, mb.advantages, mask, clip_low=low, clip_high=high,
            rho_max=2.0, importance_level=level,
        )[0].item()  # fmt: skip

    def stepped(**algo):
        return _loss(AlgoConfig(**algo), theta, None, mb, 0, None, None, None)[0].item()

    gspo = dict(
        importance_sampling_level="sequence", sequence_clip_low=0.01, sequence_clip_high=0.02
    )
    assert stepped(**gspo) == by_hand("sequence", 0.01, 0.02)
    assert stepped() == by_hand("token", 0.2, 0.2)
    # the three differ: the level and the sequence bounds each matter
    assert len({by_hand("sequence", 0.01, 0.02), by_hand("sequence", 0.2, 0.2), stepped()}) == 3
