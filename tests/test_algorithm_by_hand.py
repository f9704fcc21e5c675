"""The RL math against numbers worked out on paper, and against AReaL's decoupled objective.

Nothing here restates ``learner/algorithm.py``: every expected value is either a
number computed by hand in a docstring or the output of a formula written from
another project's definition. A flipped sign, swapped clip bounds, a reversed
importance weight or KL, or the wrong std would each change at least one number.
"""

from __future__ import annotations

import math

import pytest
import torch

from streamrl.broker.semantics import is_stale
from streamrl.learner import algorithm

LN = math.log

# The 2-sample, 2-token batch of the docstrings below. Probabilities, not log-probs, so that
# every ratio is a fraction one can check by eye.
THETA_P = [[0.6, 0.2], [0.25, 0.9]]
PROX_P = [[0.4, 0.4], [0.5, 0.6]]
MU_P = [[0.25, 0.5], [0.5, 0.5]]
ADVANTAGES = [1.0, -1.0]
CLIP_LOW, CLIP_HIGH, RHO = 0.2, 0.3, 1.5


def _logs(probs) -> torch.Tensor:
    return torch.tensor([[LN(p) for p in row] for row in probs], dtype=torch.float64)


def _loss(mask, aggregation="token_mean", normalizer=None, **kw):
    theta = _logs(THETA_P).requires_grad_()
    loss, stats = algorithm.policy_loss(
        theta, _logs(MU_P), torch.tensor(ADVANTAGES, dtype=torch.float64), mask,
        rho_max=RHO, proximal_logprobs=_logs(PROX_P), aggregation=aggregation,
        normalizer=normalizer, **{"clip_low": CLIP_LOW, "clip_high": CLIP_HIGH, **kw},
    )  # fmt: skip
    loss.backward()
    return loss.item(), theta.grad.flatten().tolist(), stats


ALL = torch.ones(2, 2, dtype=torch.bool)


def test_decoupled_loss_of_a_two_by_two_batch_worked_on_paper():
    """clip range [1 - 0.2, 1 + 0.3] = [0.8, 1.3], rho_max = 1.5, A = (+1, -1).

    token  pi_theta pi_prox mu    w = pi_prox/mu      r = pi_theta/pi_prox  A   min(rA, clip(r)A)  l = -w min(..)
    (0,0)  0.6      0.4     0.25  1.6 -> 1.5 (trunc)  1.5 (> 1.3)           +1  1.3  (clipped)      -1.95
    (0,1)  0.2      0.4     0.5   0.8                 0.5 (< 0.8)           +1  0.5                 -0.40
    (1,0)  0.25     0.5     0.5   1.0                 0.5 (< 0.8)           -1  -0.8 (clipped)      +0.80
    (1,1)  0.9      0.6     0.5   1.2                 1.5 (> 1.3)           -1  -1.5                +1.80

    token_mean = (-1.95 - 0.4 + 0.8 + 1.8) / 4 = 0.0625.
    d l / d log pi_theta = -w r A where the unclipped term is the min, 0 where the clipped one is:
    (0,0) 0, (0,1) -0.8 * 0.5 / 4 = -0.1, (1,0) 0, (1,1) +1.2 * 1.5 / 4 = +0.45.
    Stats: 2 of 4 clipped; mean w = (1.5 + 0.8 + 1 + 1.2) / 4 = 1.125; 1 of 4 truncated.

    What the usual mistakes give instead: w = mu/pi_prox gives w = (0.625, 1.25, 1, 0.833) and the
    loss 0.153; swapped bounds [0.7, 1.2] make (0,0) -1.8 and (1,0) +0.7 (loss 0.075); no
    truncation makes (0,0) -2.08 (loss 0.03).
    """
    loss, grad, stats = _loss(ALL)
    assert loss == pytest.approx(0.0625, abs=1e-12)
    assert grad == pytest.approx([0.0, -0.1, 0.0, 0.45], abs=1e-12)
    assert stats.tokens == 4
    assert stats.clip_fraction == pytest.approx(0.5)
    assert stats.is_weight_mean == pytest.approx(1.125)
    assert stats.is_truncated_fraction == pytest.approx(0.25)


def test_stale_token_is_masked_and_each_aggregation_divides_as_defined():
    """Token (1,1) sampled at version 2, the others at version 4; learner at version 5 with
    max_staleness 2: staleness (1,1) = 3 > 2, masked. Counted losses: -1.95, -0.4 | +0.8.

    token_mean = (-1.95 - 0.4 + 0.8) / 3 = -1.55 / 3
    seq_mean   = ((-1.95 - 0.4) / 2 + 0.8 / 1) / 2 = (-1.175 + 0.8) / 2 = -0.1875
    constant   = (-1.95 - 0.4 + 0.8) / 10 = -0.155   (C = 10)
    Gradients (only (0,1) is unclipped and counted): -0.4 divided by 3 / by 2*2 / by 10;
    the stale token's gradient is 0 whatever its values.
    """
    versions = torch.tensor([[4, 4], [4, 2]])
    staleness = algorithm.token_staleness(5, versions)
    assert staleness.tolist() == [[1, 1], [1, 3]]
    mask = ~is_stale(5, versions, 2)
    assert mask.tolist() == [[True, True], [True, False]]
    for aggregation, normalizer, expected, divisor in (
        ("token_mean", None, -1.55 / 3, 3),
        ("seq_mean", None, -0.1875, 4),
        ("constant", 10.0, -0.155, 10),
    ):
        loss, grad, stats = _loss(mask, aggregation, normalizer)
        assert loss == pytest.approx(expected, abs=1e-12), aggregation
        assert grad == pytest.approx([0.0, -0.4 / divisor, 0.0, 0.0], abs=1e-12), aggregation
        assert stats.tokens == 3


def test_aggregation_of_a_per_token_loss_by_hand():
    """per-token [[1, 2, 4], [8, 16, 32]], row 0 counts 3 tokens, row 1 only its first.

    token_mean = (1 + 2 + 4 + 8) / 4 = 3.75; seq_mean = (7/3 + 8/1) / 2 = 31/6;
    constant C=5: 15 / 5 = 3 (C=1: 15, C=0.5: 30); a normalizer overrides the denominator: token_mean / 10 = 1.5,
    seq_mean / 4 = (7/3 + 8) / 4 = 31/12.
    """
    per_token = torch.tensor([[1.0, 2.0, 4.0], [8.0, 16.0, 32.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True], [True, False, False]])
    assert algorithm.aggregate(per_token, mask, "token_mean").item() == pytest.approx(3.75)
    assert algorithm.aggregate(per_token, mask, "seq_mean").item() == pytest.approx(31 / 6)
    assert algorithm.aggregate(per_token, mask, "constant", 5.0).item() == pytest.approx(3.0)
    assert algorithm.aggregate(per_token, mask, "token_mean", 10.0).item() == pytest.approx(1.5)
    assert algorithm.aggregate(per_token, mask, "seq_mean", 4.0).item() == pytest.approx(31 / 12)
    # a sequence with no counted token is left out of seq_mean's count: (7/3) / 1
    empty_row = torch.tensor([[True, True, True], [False, False, False]])
    assert algorithm.aggregate(per_token, empty_row, "seq_mean").item() == pytest.approx(7 / 3)
    # any positive constant is a valid normaliser, 1 and below included
    assert algorithm.aggregate(per_token, mask, "constant", 1.0).item() == pytest.approx(15.0)
    assert algorithm.aggregate(per_token, mask, "constant", 0.5).item() == pytest.approx(30.0)
    for bad in (None, 0.0, -1.0):
        with pytest.raises(
            ValueError, match=r"^aggregation 'constant' needs a positive normalizer$"
        ):
            algorithm.aggregate(per_token, mask, "constant", bad)


def test_k3_kl_is_to_the_reference_from_the_policy_side():
    """k3 = exp(ref - theta) - (ref - theta) - 1 estimates KL(pi_theta || pi_ref) on tokens
    sampled from pi_theta (Schulman, "Approximating KL divergence").

    pi_theta = (0.25, 0.2), pi_ref = (0.5, 0.8): ref/theta = 2 and 4.
    k3 = (2 - ln 2 - 1, 4 - ln 4 - 1) = (0.30685, 1.61371); mean = 2 - 1.5 ln 2 = 0.96028.
    Reversed (theta/ref = 0.5, 0.25): (ln 2 - 0.5, 2 ln 2 - 0.75), mean 0.41472.
    d k3 / d theta = 1 - ref/theta = (-1, -3): with beta 0.1 over 2 tokens the gradient is
    (-0.05, -0.15), pulling pi_theta up towards pi_ref. A = 0 isolates the KL term.
    """
    theta = torch.tensor([[LN(0.25), LN(0.2)]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[LN(0.5), LN(0.8)]], dtype=torch.float64)
    k3 = algorithm.k3_kl(theta.detach(), ref)
    assert k3.tolist()[0] == pytest.approx([1 - LN(2), 3 - LN(4)], abs=1e-12)
    loss, stats = algorithm.policy_loss(
        theta, theta.detach(), torch.zeros(1, dtype=torch.float64), torch.ones(1, 2, dtype=torch.bool),
        clip_low=0.2, clip_high=0.2, rho_max=2.0, ref_logprobs=ref, kl_coef=0.1,
    )  # fmt: skip
    loss.backward()
    assert loss.item() == pytest.approx(0.1 * (2 - 1.5 * LN(2)), abs=1e-12)
    assert stats.kl == pytest.approx(2 - 1.5 * LN(2), abs=1e-12)
    assert theta.grad.tolist()[0] == pytest.approx([-0.05, -0.15], abs=1e-12)


def test_kl_and_entropy_are_off_by_default_even_where_the_reference_gives_zero_probability():
    """Default kl_coef and entropy_coef are 0: the reference (here log 0 = -inf on one token, k3
    infinite) and the entropy are reported, never trained. Loss 0 at A = 0, not 0 * inf."""
    theta = torch.tensor([[LN(0.25), LN(0.5)]], dtype=torch.float64)
    ref = torch.tensor([[LN(0.5), float("-inf")]], dtype=torch.float64)
    loss, stats = algorithm.policy_loss(
        theta, theta, torch.zeros(1, dtype=torch.float64), torch.ones(1, 2, dtype=torch.bool),
        clip_low=0.2, clip_high=0.2, rho_max=2.0, ref_logprobs=ref,
        entropy=torch.tensor([[1.0, 3.0]], dtype=torch.float64),
    )  # fmt: skip
    assert loss.item() == 0.0
    assert stats.entropy == pytest.approx(2.0) and stats.kl == float("inf")
    loss, stats = algorithm.policy_loss(
        theta[:, :1], theta[:, :1], torch.zeros(1, dtype=torch.float64),
        torch.ones(1, 1, dtype=torch.bool), clip_low=0.2, clip_high=0.2, rho_max=2.0,
        ref_logprobs=ref[:, :1], kl_coef=0.0,
    )  # fmt: skip
    assert loss.item() == 0.0 and stats.kl == pytest.approx(1 - LN(2))


def test_truncation_is_exact_in_double_precision_and_strictly_above_rho():
    """w = 0.8/0.25 = 3.2 truncated at rho 1.1 (not a float32 number): l = -1.1 * r A = -1.1 to
    double precision. A weight equal to rho (pi_prox = mu, w = 1, rho = 1) is not truncated."""
    theta = torch.tensor([[LN(0.8)]], dtype=torch.float64)
    one = torch.ones(1, 1, dtype=torch.bool)
    adv = torch.tensor([1.0], dtype=torch.float64)
    loss, stats = algorithm.policy_loss(
        theta, torch.tensor([[LN(0.25)]], dtype=torch.float64), adv, one, clip_low=0.2,
        clip_high=0.2, rho_max=1.1, proximal_logprobs=theta,
    )  # fmt: skip
    assert abs(loss.item() + 1.1) < 1e-15 and stats.is_truncated_fraction == 1.0
    _, stats = algorithm.policy_loss(
        theta, theta, adv, one, clip_low=0.2, clip_high=0.2, rho_max=1.0, proximal_logprobs=theta
    )
    assert stats.is_weight_mean == 1.0 and stats.is_truncated_fraction == 0.0


def test_drift_kl_to_the_behaviour_policy_when_there_is_no_reference():
    """No reference: the reported kl is k3 against mu (0.5 vs pi_theta 0.25: 1 - ln 2), untrained."""
    theta = torch.tensor([[LN(0.25)]], dtype=torch.float64)
    _, stats = algorithm.policy_loss(
        theta, torch.tensor([[LN(0.5)]], dtype=torch.float64), torch.zeros(1, dtype=torch.float64),
        torch.ones(1, 1, dtype=torch.bool), clip_low=0.2, clip_high=0.2, rho_max=2.0, kl_coef=0.5,
    )  # fmt: skip
    assert stats.kl == pytest.approx(1 - LN(2), abs=1e-12)


def test_entropy_bonus_lowers_the_loss_by_coef_times_mean_entropy():
    """A = 0, entropies (1.0, 3.0), coef 0.5: loss = -0.5 * (1 + 3) / 2 = -1; stats.entropy = 2."""
    theta = torch.zeros(1, 2, dtype=torch.float64)
    entropy = torch.tensor([[1.0, 3.0]], dtype=torch.float64)
    loss, stats = algorithm.policy_loss(
        theta, theta, torch.zeros(1, dtype=torch.float64), torch.ones(1, 2, dtype=torch.bool),
        clip_low=0.2, clip_high=0.2, rho_max=2.0, entropy=entropy, entropy_coef=0.5,
    )  # fmt: skip
    assert loss.item() == pytest.approx(-1.0) and stats.entropy == pytest.approx(2.0)


def test_without_importance_correction_the_ratio_is_against_mu_and_no_weight_applies():
    """importance_correction=False: r = pi_theta / mu, w = 1, pi_prox ignored.

    Row 0 of the paper batch: (0,0) r = 0.6/0.25 = 2.4 -> clipped at 1.3, l = -1.3;
    (0,1) r = 0.2/0.5 = 0.4, l = -0.4. token_mean = -0.85; gradient (0, -0.4/2 = -0.2).
    """
    theta = _logs(THETA_P[:1]).requires_grad_()
    loss, stats = algorithm.policy_loss(
        theta, _logs(MU_P[:1]), torch.tensor([1.0], dtype=torch.float64), torch.ones(1, 2, dtype=torch.bool),
        clip_low=CLIP_LOW, clip_high=CLIP_HIGH, rho_max=RHO, proximal_logprobs=_logs(PROX_P[:1]),
        importance_correction=False,
    )  # fmt: skip
    loss.backward()
    assert loss.item() == pytest.approx(-0.85, abs=1e-12)
    assert theta.grad.tolist()[0] == pytest.approx([0.0, -0.2], abs=1e-12)
    assert stats.is_weight_mean == 1.0 and stats.is_truncated_fraction == 0.0


def test_proximal_defaults_to_the_behaviour_policy():
    """No pi_prox: w = 1 and r = pi_theta / mu, so the loss equals importance_correction=False's."""
    theta = _logs(THETA_P)
    common = dict(clip_low=CLIP_LOW, clip_high=CLIP_HIGH, rho_max=RHO)
    adv = torch.tensor(ADVANTAGES, dtype=torch.float64)
    with_default, stats = algorithm.policy_loss(theta, _logs(MU_P), adv, ALL, **common)
    plain, _ = algorithm.policy_loss(
        theta, _logs(MU_P), adv, ALL, importance_correction=False, **common
    )
    assert with_default.item() == pytest.approx(plain.item(), abs=1e-12)
    assert stats.is_weight_mean == pytest.approx(1.0)


def test_group_advantages_by_hand():
    """rewards (1, 0, 0, 0): mean 0.25, centred (0.75, -0.25, -0.25, -0.25).
    population std = sqrt((0.5625 + 3 * 0.0625) / 4) = sqrt(0.1875) = 0.4330
    (the unbiased std would be 0.5). grpo: centred / (std + eps) = (sqrt 3, -1/sqrt 3) for eps -> 0.
    drgrpo: centred. rewards (2, 2, 2, 2): zero variance, advantages 0.
    std_threshold 0.5 > 0.433: the group falls back to mean subtraction (centred).
    """
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0], [2.0, 2.0, 2.0, 2.0]])
    root3 = math.sqrt(3)
    adv, zero = algorithm.group_advantages(rewards, "grpo", 1e-12, 1e-6)
    assert adv[0].tolist() == pytest.approx([root3, -1 / root3, -1 / root3, -1 / root3], rel=1e-9)
    assert adv[1].tolist() == [0.0] * 4 and zero.tolist() == [False, True]
    eps = 0.01
    adv, _ = algorithm.group_advantages(rewards, "grpo", eps, 1e-6)
    assert adv[0, 0].item() == pytest.approx(0.75 / (math.sqrt(0.1875) + eps), rel=1e-12)
    adv, _ = algorithm.group_advantages(rewards, "drgrpo", eps, 1e-6)
    assert adv[0].tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25], abs=1e-12)
    adv, _ = algorithm.group_advantages(rewards, "grpo", eps, 0.5)
    assert adv[0].tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25], abs=1e-12)
    # rewards (0, 2): mean 1, std exactly 1. At the threshold itself the std is used (the
    # fallback is strictly below): A = +-1 / (1 + eps), not +-1.
    adv, _ = algorithm.group_advantages(torch.tensor([[0.0, 2.0]]), "grpo", eps, 1.0)
    assert adv[0].tolist() == pytest.approx([-1 / (1 + eps), 1 / (1 + eps)], rel=1e-12)
    with pytest.raises(ValueError, match=r"\[N, G\]"):
        algorithm.group_advantages(torch.zeros(4), "grpo", eps, 1e-6)
    with pytest.raises(ValueError, match=r"\[N, G\]"):
        algorithm.group_advantages(torch.zeros(2, 0), "grpo", eps, 1e-6)


def test_staleness_tightening_by_hand():
    """clip 0.2 at rate 0.25: staleness (0, 1, 2, 5) -> 0.2 * (1, 0.75, 0.5, 0) (never negative).
    rho 3 towards floor 1 at rate 0.5: 1 + 2 * (1, 0.5, 0, 0) = (3, 2, 1, 1)."""
    staleness = torch.tensor([0, 1, 2, 5])
    assert algorithm.tighten(0.2, staleness, 0.25).tolist() == pytest.approx([0.2, 0.15, 0.1, 0.0])
    assert algorithm.tighten(3.0, staleness, 0.5, floor=1.0).tolist() == pytest.approx(
        [3.0, 2.0, 1.0, 1.0]
    )
    assert is_stale(5, 5 - staleness, 2).tolist() == [False, False, False, True]


def test_per_token_clip_ranges_and_rho_apply_token_by_token():
    """Per-token bounds (staleness tightening): the paper batch with clip_high (0.3, 0.6) on row 0
    and rho (1.5, 2.0): (0,0) r = 1.5 is now inside [0.8, 1.6], w = min(1.6, 1.5) = 1.5:
    l = -1.5 * 1.5 = -2.25; the other tokens as on paper. token_mean = (-2.25 - 0.4 + 0.8 + 1.8) / 4
    = -0.0125."""
    theta = _logs(THETA_P)
    clip_high = torch.tensor([[0.6, 0.3], [0.3, 0.3]], dtype=torch.float64)
    rho = torch.tensor([[1.5, 2.0], [2.0, 2.0]], dtype=torch.float64)
    loss, stats = algorithm.policy_loss(
        theta, _logs(MU_P), torch.tensor(ADVANTAGES, dtype=torch.float64), ALL,
        clip_low=CLIP_LOW, clip_high=clip_high, rho_max=rho, proximal_logprobs=_logs(PROX_P),
    )  # fmt: skip
    assert loss.item() == pytest.approx(-0.0125, abs=1e-12)
    assert stats.clip_fraction == pytest.approx(0.25)


def areal_decoupled_loss(theta, prox, mu, advantages, mask, eps_low, eps_high, cap):
    """AReaL's decoupled PPO actor loss, from its definition (Fu et al., "AReaL: A Large-Scale
    Asynchronous Reinforcement Learning System for Language Reasoning", 2025, eq. 5) as
    implemented in ``ppo_actor_loss_fn``, inclusionAI/AReaL ``areal/utils/functional.py``
    (commit 56bad8b2):

        L = -1/|T| sum_t [pi_prox/mu]_t * min(r_t A_t, clip(r_t, 1 - eps, 1 + eps_high) A_t),
        r_t = pi_theta / pi_prox (gradient), the behaviour weight pi_prox/mu without gradient,
        |T| = number of loss-mask tokens.

    AReaL drops a token whose weight exceeds ``behav_imp_weight_cap`` (weight 0); streamrl
    truncates it to rho_max. The two agree wherever no weight exceeds the cap.
    Written per token over plain floats; only the gradient's source is a tensor.
    """
    total, count = 0.0, 0
    for i in range(len(mu)):
        for t in range(len(mu[i])):
            if not mask[i][t]:
                continue
            weight = math.exp(prox[i][t] - mu[i][t])
            if weight > cap:
                weight = 0.0
            r = torch.exp(theta[i, t] - prox[i][t])
            low, high = 1.0 - eps_low, 1.0 + eps_high
            clipped = torch.clamp(r, low, high)
            a = advantages[i]
            total = total + weight * torch.maximum(-a * r, -a * clipped)
            count += 1
    return total / max(count, 1)


@pytest.mark.parametrize("seed", range(8))
def test_decoupled_loss_equals_areal_where_no_weight_reaches_the_cap(seed):
    g = torch.Generator().manual_seed(seed)
    shape = (3, 5)
    theta = (-torch.rand(shape, generator=g, dtype=torch.float64) * 2).requires_grad_()
    prox = theta.detach() + torch.randn(shape, generator=g, dtype=torch.float64) * 0.3
    mu = prox + torch.randn(shape, generator=g, dtype=torch.float64) * 0.3
    adv = torch.randn(3, generator=g, dtype=torch.float64)
    mask = torch.rand(shape, generator=g) > 0.25
    cap = 100.0
    ours, _ = algorithm.policy_loss(
        theta, mu, adv, mask, clip_low=0.2, clip_high=0.28, rho_max=cap, proximal_logprobs=prox
    )
    (ours_grad,) = torch.autograd.grad(ours, theta)
    theirs = areal_decoupled_loss(
        theta, prox.tolist(), mu.tolist(), adv.tolist(), mask.tolist(), 0.2, 0.28, cap
    )
    (their_grad,) = torch.autograd.grad(theirs, theta)
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-12, abs=1e-12)
    assert torch.allclose(ours_grad, their_grad, rtol=1e-10, atol=1e-12)


def test_over_the_cap_streamrl_truncates_where_areal_drops():
    """One token, w = pi_prox/mu = 0.8/0.25 = 3.2 > cap 2, r = 1, A = 1: AReaL's loss is 0,
    streamrl's is -min(3.2, 2) * 1 = -2 (V-trace's truncated weight keeps the token's signal)."""
    theta = torch.tensor([[LN(0.8)]], dtype=torch.float64, requires_grad=True)
    prox, mu = [[LN(0.8)]], [[LN(0.25)]]
    mask = [[True]]
    theirs = areal_decoupled_loss(theta, prox, mu, [1.0], mask, 0.2, 0.2, 2.0)
    ours, stats = algorithm.policy_loss(
        theta, torch.tensor(mu, dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64),
        torch.tensor(mask), clip_low=0.2, clip_high=0.2, rho_max=2.0,
        proximal_logprobs=torch.tensor(prox, dtype=torch.float64),
    )  # fmt: skip
    assert theirs.item() == 0.0
    assert ours.item() == pytest.approx(-2.0) and stats.is_truncated_fraction == 1.0


GSPO_S = math.sqrt(0.75)


def test_gspo_sequence_ratio_of_the_two_by_two_batch_worked_on_paper():
    """importance_level sequence, clip range [1 - 0.1, 1 + 0.3] = [0.9, 1.3].

    s_i = exp(mean_t log(pi_theta / pi_prox)), the geometric mean of the token ratios:
    seq 0: ratios 1.5, 0.5 -> s_0 = sqrt(0.75) = 0.866 (the arithmetic mean would be 1.0);
    seq 1: ratios 0.5, 1.5 -> s_1 = 0.866 as well.
    seq 0, A = +1: min(0.866, clip(0.866) = 0.9) = 0.866, unclipped; l = -w s_0: -1.5 s_0, -0.8 s_0
    seq 1, A = -1: min(-0.866, -0.9) = -0.9, clipped;                  l = +0.9 w: 0.9, 1.08
    token_mean = (-2.3 s_0 + 1.98) / 4.
    Gradient: d s_0 / d log pi_theta(t) = s_0 / 2 for both tokens of seq 0, so each gets
    -(1.5 + 0.8) s_0 / 2 / 4; seq 1 is clipped: 0. Token-level ratios would clip (0,0) at 1.3
    and (0,1) at 0.9 instead.
    """
    loss, grad, stats = _loss(ALL, importance_level="sequence", clip_low=0.1)
    assert loss == pytest.approx((-2.3 * GSPO_S + 1.98) / 4, abs=1e-12)
    assert grad == pytest.approx([-2.3 * GSPO_S / 8, -2.3 * GSPO_S / 8, 0.0, 0.0], abs=1e-12)
    assert stats.clip_fraction == pytest.approx(0.5)
    assert stats.is_weight_mean == pytest.approx(1.125)


def test_gspo_takes_a_sequence_its_counted_tokens_and_tightest_bound():
    """Token (1,1) is masked, so seq 1's ratio is its one token's, 0.5. Per-token lower bounds
    [[0.1, 0.05], [0.1, 0.01]]: seq 0 takes 0.05 ([0.95, 1.3]: s_0 = 0.866 stays unclipped,
    A = +1), seq 1 takes 0.1, not the masked token's 0.01 ([0.9, 1.3]: 0.5 -> 0.9, A = -1,
    l = +0.9 w = 0.9). token_mean over 3 tokens = (-2.3 s_0 + 0.9) / 3; with 0.01 leaking in it
    would be (-2.3 s_0 + 0.99) / 3.
    """
    mask = torch.tensor([[True, True], [True, False]])
    low = torch.tensor([[0.1, 0.05], [0.1, 0.01]], dtype=torch.float64)
    loss, grad, _ = _loss(mask, importance_level="sequence", clip_low=low)
    assert loss == pytest.approx((-2.3 * GSPO_S + 0.9) / 3, abs=1e-12)
    assert grad == pytest.approx([-2.3 * GSPO_S / 6, -2.3 * GSPO_S / 6, 0.0, 0.0], abs=1e-12)


def test_an_unknown_importance_level_is_refused():
    with pytest.raises(ValueError, match="importance level"):
        _loss(ALL, importance_level="group")
